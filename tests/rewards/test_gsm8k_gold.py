"""The math reward on every GSM8K test answer: gold scores 1.0, a perturbed answer 0.0.

Uses `../shared/data/gsm8k/test.jsonl` (1,319 rows) when this checkout sits next
to it, else the file named by ``TEMPER_GSM8K_TEST``; skips with the reason otherwise.
"""

import asyncio
import json
import os
from decimal import Decimal
from pathlib import Path

import pytest

from temper.records import Task
from temper.rewards.answers import extract_gsm8k_answer
from temper.rewards.base import RewardInput
from temper.rewards.math_verify_reward import MathVerifyReward

ROOT = Path(__file__).resolve().parents[2]
GSM8K_TEST = Path(os.environ.get("TEMPER_GSM8K_TEST", ROOT.parent / "shared/data/gsm8k/test.jsonl"))


def _perturb(number: str) -> str:
    """A different number: +1 on the last digit's place (so 18 -> 19, 2.5 -> 2.6)."""
    value = Decimal(number)
    exponent = value.as_tuple().exponent
    step = Decimal(1).scaleb(exponent) if isinstance(exponent, int) and exponent < 0 else 1
    return str(value + step)


@pytest.mark.slow
@pytest.mark.skipif(not GSM8K_TEST.is_file(), reason=f"GSM8K test file not found at {GSM8K_TEST}")
def test_math_reward_accepts_every_gsm8k_gold_answer_and_rejects_perturbed_ones():
    rows = [json.loads(line) for line in GSM8K_TEST.read_text().splitlines() if line.strip()]
    assert len(rows) == 1319
    tasks = [Task(id=str(i), prompt=r["question"], answer=r["answer"]) for i, r in enumerate(rows)]
    golds = [extract_gsm8k_answer(r["answer"]) for r in rows]
    assert all(golds)
    bare = [RewardInput(t, t.prompt, g) for t, g in zip(tasks, golds, strict=True)]
    sentence = [
        RewardInput(t, t.prompt, f"The answer is {g}.") for t, g in zip(tasks, golds, strict=True)
    ]
    wrong = [
        RewardInput(t, t.prompt, f"The answer is {_perturb(g)}.")
        for t, g in zip(tasks, golds, strict=True)
    ]
    with MathVerifyReward(workers=2, timeout_s=20.0) as reward:
        results = asyncio.run(reward.score(bare + sentence + wrong))
    n = len(rows)
    counts = {
        "bare_gold_1.0": sum(r.score == 1.0 for r in results[:n]),
        "sentence_gold_1.0": sum(r.score == 1.0 for r in results[n : 2 * n]),
        "perturbed_0.0": sum(r.score == 0.0 and r.error is None for r in results[2 * n :]),
    }
    print("GSM8K gold counts:", counts)
    failures = [
        (rows[i % n]["answer"][-30:], results[i].error)
        for i in range(3 * n)
        if (results[i].score != 1.0) == (i < 2 * n)
    ]
    assert counts == {"bare_gold_1.0": n, "sentence_gold_1.0": n, "perturbed_0.0": n}, failures[:5]
