"""orchestrator.placement = "auto" on real worker processes, and `temper plan`.

The run probes (colocated, split, colocated), reads its own metrics back,
applies the plan, and a resumed run applies the same plan again. The worker
thread counts checked are the ones the workers' compute threads report.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from temper import compute
from temper.cli.main import main
from temper.config import load_config
from temper.errors import ConfigError

WARMUP, STEPS = 3, 5
COMMON = [
    "--orchestrator.backend=process",
    "--orchestrator.placement=auto",
    f"--orchestrator.placement_warmup_steps={WARMUP}",
    "--orchestrator.prompts_per_step=2",
    "--orchestrator.group_size=4",
    "--orchestrator.max_response_tokens=8",
    "--eval.at_start=false",
    "--eval.at_end=false",
    "--log.progress=false",
    "--log.trajectories_per_step=0",
    "--orchestrator.drop_zero_variance_groups=false",
    "--run.seed=3",
]

pytestmark = pytest.mark.skipif(compute.cores() < 2, reason="a split needs 2 cores")


def _rows(run: Path) -> list[dict]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if "time_step_s" in r]


def _placement(row: dict) -> tuple[int, int, int]:
    keys = ("rollout_units", "trainer_units", "max_staleness")
    return tuple(int(row[f"placement/{k}"]) for k in keys)


def _train(root: Path, *extra: str) -> int:
    return main(["train", f"--run.output_dir={root}", "--run.name=auto", *COMMON, *extra])


@pytest.mark.slow
def test_auto_probes_applies_its_plan_and_a_resume_keeps_it(tmp_path, capsys):
    cores = compute.cores()
    half = cores // 2
    assert _train(tmp_path, f"--orchestrator.steps={STEPS}") == 0
    run = tmp_path / "auto"
    rows = _rows(run)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    colocated, split = (cores, cores, 0), (half, cores - half, 0)
    assert [_placement(r) for r in rows[:WARMUP]] == [colocated, split, colocated]
    assert [r["placement/worker_threads"] for r in rows[:WARMUP]] == [cores, half, cores]
    events = [json.loads(x) for x in (run / "events.jsonl").read_text().splitlines()]
    chosen = [e for e in events if e["kind"] == "placement"]
    assert len(chosen) == 1 and chosen[0]["step"] == WARMUP + 1
    best = chosen[0]["plan"]["best"]
    want = (best["rollout_units"], best["trainer_units"], best["max_staleness"])
    threads = max(1, want[0])  # one worker: it gets all the rollout units
    for r in rows[WARMUP:]:
        assert _placement(r) == want and r["placement/worker_threads"] == threads
        assert ("async/in_flight" in r) == (want[2] > 0)
        assert r["policy_version"] == r["step"]
    # `temper plan` reads the same run back.
    capsys.readouterr()
    assert main(["plan", str(run), "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["units"] == cores and plan["steps_used"] == STEPS - 1
    assert {o["max_staleness"] for o in plan["options"]} == {0, 1, 2}
    assert main(["plan", str(run)]) == 0
    table = capsys.readouterr().out
    assert table.count("\n* ") + table.startswith("* ") == 1 and "colocated" in table

    # Resumed: the warm-up steps are read back, the same plan applies, no new probe.
    assert _train(tmp_path, f"--orchestrator.steps={STEPS + 2}", "--run.resume=true") == 0
    rows = _rows(run)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 3))
    assert all(_placement(r) == want for r in rows[WARMUP:])
    events = [json.loads(x) for x in (run / "events.jsonl").read_text().splitlines()]
    assert len([e for e in events if e["kind"] == "placement"]) == 1


def test_auto_placement_is_refused_where_it_cannot_place(tmp_path, capsys):
    for bad, match in [
        (["--orchestrator.backend=local"], "needs backend = 'process' or 'ray'"),
        (["--orchestrator.max_staleness=1"], "chooses the staleness itself"),
        (["--orchestrator.steps=6"], r"placement_warmup_steps \(6\) must be below"),
        (["--orchestrator.placement_warmup_steps=2"], "placement_warmup_steps"),
    ]:
        with pytest.raises(ConfigError, match=match):
            load_config(None, ["--orchestrator.placement=auto", "--orchestrator.backend=process",
                               "--orchestrator.steps=10", *bad])  # fmt: skip
    code = main(["train", f"--run.output_dir={tmp_path}", "--orchestrator.backend=process",
                 "--orchestrator.placement=auto", "--trainer.world_size=2"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and "needs trainer.world_size = 1" in err and len(err.splitlines()) == 1
    assert not any(tmp_path.iterdir())  # refused before a run directory was made


def test_plan_refuses_what_it_cannot_read(tmp_path, capsys):
    assert main(["plan", str(tmp_path / "missing")]) == 2
    assert "is not a run directory" in capsys.readouterr().err
    run = tmp_path / "old"
    run.mkdir()
    (run / "config.toml").write_text("")
    rows = [{"step": s, "time_step_s": 1.0, "time_train_s": 0.5} for s in (1, 2, 3)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["plan", str(run)]) == 2
    err = capsys.readouterr().err
    assert "needs at least 2 measured training steps" in err and len(err.splitlines()) == 1
    assert main(["plan", str(run), "--units=0"]) == 2
    assert "--units must be >= 1" in capsys.readouterr().err


def test_plan_reads_stages_and_eval_time_from_a_run_directory(tmp_path):
    from temper.orchestrator.auto_placement import run_plan

    run = tmp_path / "run"
    (run / "eval").mkdir(parents=True)
    (run / "config.toml").write_text("")
    rows = []
    for step, units in [(1, 2), (2, 2), (3, 1), (4, 2), (5, 1)]:
        rows.append({
            "step": step, "time_step_s": 2.0, "time_generate_s": 1.0, "time_reward_s": 0.0,
            "time_rollout_busy_s": 1.0, "time_train_s": 0.8, "time_weight_sync_s": 0.1,
            "tokens_generated": 10.0, "train_tokens": 10.0, "placement/rollout_units": units,
            "placement/trainer_units": units, "placement/max_staleness": 0,
            "placement/machine_units": 2,
        })  # fmt: skip
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for step in (0, 5):
        (run / "eval" / f"step_{step:06d}.json").write_text(json.dumps({"time_s": 1.5}))
    plan = run_plan(run)
    assert plan.units == 2 and plan.steps_used == 4
    assert plan.eval_s_per_step == pytest.approx(3.0 / 5)
    # Stages that took as long on 1 core as on 2: exponent 0, so overlapping wins.
    assert plan.rollout_scaling.exponent == pytest.approx(0.0, abs=1e-12)
    assert plan.best.placement.max_staleness == 1
    # How to run it: the run was local, so the split needs rollout workers.
    assert plan.notes[-1].endswith(
        "--orchestrator.backend=process --orchestrator.worker_threads=1 --run.threads=1 "
        "--orchestrator.max_staleness=1 (or --orchestrator.placement=auto)"
    )
    coloc = next(o for o in plan.options if o.placement.colocated(2))
    assert coloc.measured_step_s == pytest.approx(2.0) and coloc.step_s == pytest.approx(2.0)
    assert run_plan(run, units=4).units == 4
    assert {o.placement.max_staleness for o in run_plan(run, max_staleness=0).options} == {0}
