"""Counts for issue 14 (not a test): honest code at 1.0, HumanEval at 1.0, attacks at 0.

Every program goes through the code env (`CodeEnv`, default options: static
detectors on, ``zero_hacks = "confirmed"``) on a real warm sandbox pool:

- the honest corpus (`honest_corpus/`), each with its own test cases;
- HumanEval's 164 canonical solutions, with their ``check`` programs;
- every attack program of `test_code_hacks.py` (``ATTACKS``) and
  `test_code_tests.py` (``HACKS`` and ``SNOOP``) against ``double(x)``.

    PYTHONPATH=src .venv/bin/python tests/rewards/code_reward_counts.py
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

from test_code_hacks import ATTACKS, _double_task  # noqa: E402
from test_code_honest_corpus import load_corpus  # noqa: E402
from test_code_tests import HACKS, SNOOP  # noqa: E402

from temper.envs.base import AssistantTurn  # noqa: E402
from temper.envs.code import CodeEnv  # noqa: E402
from temper.envs.code_tasks import humaneval_tasks  # noqa: E402
from temper.sandbox import SandboxPool  # noqa: E402


def play(pool: Any, items: list) -> list:
    async def one(source, task):
        env = CodeEnv(task, pool, timeout_s=8.0, test_timeout_s=4.0)
        await env.reset(task, 0)
        return await env.step(AssistantTurn(f"```python\n{source}```", [], [], [], "stop", 0))

    async def every():
        sem = asyncio.Semaphore(4)

        async def limited(source, task):
            async with sem:
                return await one(source, task)

        return await asyncio.gather(*(limited(s, t) for s, t in items))

    return asyncio.run(every())


def main() -> None:
    with SandboxPool(pool_size=4, timeout_s=20, cpu_s=20) as pool:
        corpus = load_corpus()
        steps = play(pool, list(corpus.values()))
        full = [n for n, s in zip(corpus, steps, strict=True) if s.reward == 1.0]
        clean = sum(not s.info["hacks"] for s in steps)
        print(f"honest corpus: {len(full)}/{len(corpus)} at 1.0 "
              f"({clean} without any static finding); below 1.0: {sorted(set(corpus) - set(full))}")  # fmt: skip
        tasks = humaneval_tasks()
        steps = play(pool, [(t.columns["reference"], t) for t in tasks])
        print(f"humaneval canonical: {sum(s.reward == 1.0 for s in steps)}/{len(tasks)} at 1.0")
        task = _double_task()
        attacks = {f"detector: {k}": v[0] for k, v in ATTACKS.items()}
        attacks.update({f"harness: {k}": v for k, v in HACKS.items()}, **{"harness: snoop": SNOOP})
        steps = play(pool, [(src, task) for src in attacks.values()])
        zero = [n for n, s in zip(attacks, steps, strict=True) if s.reward == 0.0]
        print(f"attacks: {len(zero)}/{len(attacks)} at 0; paid: {sorted(set(attacks) - set(zero))}")


if __name__ == "__main__":
    main()
