"""Asynchronous off-policy training: bounded staleness, corrections, interruption."""

import asyncio
import json
from pathlib import Path

import pytest

from quick_run import QUIET
from temper.cli.main import main

ROOT = Path(__file__).resolve().parents[2]

ASYNC = [
    str(ROOT / "configs" / "tool_use.toml"),
    "--orchestrator.steps=4",
    "--orchestrator.prompts_per_step=3",
    "--orchestrator.group_size=2",
    "--orchestrator.drop_zero_variance_groups=false",
    "--orchestrator.max_response_tokens=32",
    "--env.options.categories=['calc', 'lookup']",
    "--env.options.tool_latency_ms=[20, 200]",
    "--log.trajectories_per_step=6",
    *QUIET,
]


def _metrics(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("staleness", "interrupt", "correction"),
    [(1, "continue", "tis"), (2, "abort", "decoupled")],
)
def test_async_run_respects_max_staleness(tmp_path, staleness, interrupt, correction):
    name = f"async_{staleness}"
    code = main(
        [
            "train",
            *ASYNC,
            f"--run.output_dir={tmp_path}",
            f"--run.name={name}",
            f"--orchestrator.max_staleness={staleness}",
            f"--orchestrator.interrupt={interrupt}",
            f"--algo.off_policy_correction={correction}",
        ]
    )
    assert code == 0
    metrics = _metrics(tmp_path / name)
    assert [m["step"] for m in metrics] == [1, 2, 3, 4]
    for m in metrics:
        assert m["staleness_max"] <= staleness
        assert m["policy_version"] == m["step"]
        assert m["is_weight_mean"] > 0 and "is_ratio_max" in m
        assert "async/in_flight" in m
    # Every token of every trained group was sampled within the bound, by a real version.
    for step in range(1, 5):
        path = tmp_path / name / "trajectories" / f"step_{step:06d}.jsonl"
        for record in map(json.loads, path.read_text().splitlines()):
            sampled = [v for v, m in zip(record["versions"], record["loss_mask"], strict=True) if m]
            assert all(step - 1 - staleness <= v <= step - 1 for v in sampled)
            if interrupt == "abort":  # each group sampled by one version only
                assert len(set(sampled)) <= 1
    # The producer ran ahead, so groups were in flight at every weight update.
    if interrupt == "abort":  # they were restarted on the new weights
        assert metrics[-1]["async/aborted_total"] > 0
    else:  # they went on and were trained on: sampled partly by an older policy
        assert max(m["staleness_max"] for m in metrics) >= 1


def test_async_needs_train_mode(tmp_path, capsys):
    code = main(
        [
            "train",
            *ASYNC,
            f"--run.output_dir={tmp_path}",
            "--orchestrator.max_staleness=1",
            "--orchestrator.mode=rollout_only",
        ]
    )
    assert code == 2
    assert "max_staleness" in capsys.readouterr().err


def test_is_band_must_be_ordered(tmp_path, capsys):
    code = main(["train", *ASYNC, f"--run.output_dir={tmp_path}", "--algo.is_low=3"])
    assert code == 2
    assert "is_low" in capsys.readouterr().err


class _GatedSource:
    """A rollout source whose groups finish when the test says so (scheduling only).

    Each group is one trajectory whose tokens carry the weight version current
    when the group started, so its staleness is known exactly.
    """

    def __init__(self, version):
        self.version = version
        self.gates: dict[str, asyncio.Event] = {}

    async def groups(self, tasks, params, seed=None):
        from temper.records import Trajectory

        [task] = tasks
        started = self.version()
        await self.gates.setdefault(task.id, asyncio.Event()).wait()
        traj = Trajectory(
            task_id=task.id,
            group_id=0,
            prompt_ids=[1],
            response_ids=[2],
            loss_mask=[1],
            behaviour_logprobs=[-0.1],
            versions=[started],
            finish_reason="stop",
        )
        return [[traj]], {}

    async def finish(self, task_id):
        self.gates.setdefault(task_id, asyncio.Event()).set()
        for _ in range(5):  # let the group's task complete
            await asyncio.sleep(0)


def test_finished_groups_are_taken_oldest_first():
    from temper.engine.base import SamplingParams
    from temper.orchestrator.async_rollouts import AsyncRollouts
    from temper.records import Task

    version = [0]
    source = _GatedSource(lambda: version[0])
    ids = iter(f"t{i}" for i in range(100))
    rollouts = AsyncRollouts(
        source,
        lambda: Task(id=next(ids), prompt="p"),
        SamplingParams(n=1),
        prompts_per_step=1,
        max_staleness=2,
        interrupt="continue",
        seed=0,
        version=lambda: version[0],
    )

    async def go():
        rollouts.start(1)
        await asyncio.sleep(0)  # t0, t1, t2 start at version 0 (slots 1-3)
        await source.finish("t0")
        [[first]], _ = await rollouts.take(1)
        version[0] = 1
        rollouts.weights_updated(1)
        await asyncio.sleep(0)  # t3 starts at version 1 (slot 4)
        await source.finish("t3")  # finishes first, but is the newer group
        await source.finish("t1")
        [[second]], _ = await rollouts.take(2)
        await rollouts.close()
        return first, second

    first, second = asyncio.run(go())
    assert first.task_id == "t0"
    assert (second.task_id, second.versions) == ("t1", [0])
    assert rollouts.stats.expired == 0
