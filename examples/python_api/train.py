"""Train from Python with your own reward function and an in-memory dataset.

    python examples/python_api/train.py

The built-in tiny model learns to answer "What is a + b?" for this script's own
rows; the reward is a plain Python function with TRL's signature. The run
directory (metrics, report.html, checkpoints) is runs/python_api/.
"""

import random
import re

import temper


def exact_sum(prompts, completions, answer, **kwargs):
    """1.0 when the last \\boxed{...} of a completion is the reference answer."""
    scores = []
    for completion, target in zip(completions, answer, strict=True):
        boxed = re.findall(r"\\boxed\{([^}]*)\}", completion)
        scores.append(1.0 if boxed and boxed[-1].strip() == target else 0.0)
    return scores


def rows(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        out.append({"prompt": f"What is {a} + {b}?", "answer": str(a + b)})
    return out


if __name__ == "__main__":
    result = temper.train(
        {
            "run": {"name": "python_api", "overwrite": True},
            "orchestrator": {"steps": 20, "prompts_per_step": 8, "group_size": 8},
            "eval": {"every": 10},
        },
        reward_funcs=[exact_sum, {"type": "format", "weight": 0.1}],
        dataset=rows(400, seed=0),
        eval_dataset=rows(32, seed=1),
    )
    print(f"run directory: {result.run_dir}")
    print(f"final accuracy: {result.final_eval.get('accuracy')}")
