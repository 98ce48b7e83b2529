"""DAPO dynamic sampling: with refill on, every step trains prompts_per_step informative groups.

A real tiny run whose reward gives every sample of a task with an even first
operand the same score (a zero-variance group, dropped) and scores the others
by the parity of the completion's length (their groups almost always differ).
"""

import asyncio
import json

import pytest

from temper.config import config_from_dict
from temper.orchestrator.loop import Orchestrator

REWARD = """
def half_flat(prompts, completions, a, **columns):
    return [0.0 if int(x) % 2 == 0 else float(len(c) % 2) for c, x in zip(completions, a)]
"""


def _run(tmp_path, name: str, refill: bool) -> list[dict]:
    reward = tmp_path / "half_flat.py"
    reward.write_text(REWARD)
    cfg = config_from_dict(
        {
            "run": {"name": name, "output_dir": str(tmp_path), "seed": 1},
            "data": {"levels": [2], "eval_size": 4},
            "reward": {
                "components": [{"type": "python", "function": f"{reward}:half_flat"}],
                "filters": [],
            },
            "sampler": {"type": "targeted"},  # sees every group, also the refilled ones
            "orchestrator": {
                "steps": 3,
                "prompts_per_step": 4,
                "group_size": 4,
                "max_response_tokens": 12,
                "refill": refill,
                "max_refill_rounds": 8,
            },
            "eval": {"at_start": False, "at_end": False, "every": 0},
            "log": {"progress": False, "trajectories_per_step": 64},
            "checkpoint": {"at_end": False},
        }
    )
    orch = Orchestrator(cfg)

    async def go() -> None:
        try:
            await orch.run()
        finally:
            await orch.close()

    asyncio.run(go())
    return [json.loads(x) for x in orch.run_dir.metrics.read_text().splitlines()]


@pytest.mark.slow
def test_refill_trains_the_configured_number_of_informative_groups(tmp_path):
    plain = _run(tmp_path, "plain", refill=False)
    assert min(m["groups_kept"] for m in plain) < 4  # the reward does make flat groups

    rows = _run(tmp_path, "refill", refill=True)
    assert [m["groups_kept"] for m in rows] == [4, 4, 4]
    assert all(m["refill/missing_groups"] == 0 for m in rows)
    assert sum(m["refill/extra_prompts"] for m in rows) > 0
    for m in rows:
        generated = 4 + m["refill/extra_prompts"]
        assert m["samples"] == generated * 4  # every generated sample is counted (its cost)
        assert m["groups_dropped"] == generated - 4
        assert m["refill/filtered_frac"] == pytest.approx(
            (generated - 4 - m["refill/surplus_groups"]) / generated
        )
    # Group ids stay unique across refill rounds (train_only replays by group id).
    recorded = tmp_path / "refill" / "trajectories" / "step_000001.jsonl"
    ids = [json.loads(x)["group_id"] for x in recorded.read_text().splitlines()]
    assert sorted(set(ids)) == list(range(4 + int(rows[0]["refill/extra_prompts"])))
