"""A reward function with TRL's signature; Temper calls it unchanged."""

import re

BOXED = re.compile(r"\\boxed\{([^}]*)\}")


def exact_boxed(prompts, completions, target, **kwargs):
    """1.0 when the last \\boxed{...} in the completion equals the `target` column."""
    scores = []
    for completion, gold in zip(completions, target, strict=True):
        found = BOXED.findall(completion)
        scores.append(1.0 if found and found[-1].strip() == str(gold) else 0.0)
    return scores
