"""End to end: a short GRPO run on the built-in model raises held-out accuracy."""

import json
from pathlib import Path

import pytest

from temper.cli.main import main

pytestmark = pytest.mark.slow


def test_short_grpo_run_improves_heldout_accuracy(tmp_path):
    code = main(
        [
            "train",
            f"--run.output_dir={tmp_path}",
            "--run.name=learn",
            "--orchestrator.steps=15",
            "--eval.every=0",
            "--eval.size=100",
            "--eval.k=2",
            "--trainer.lr=2e-4",
            "--log.progress=false",
            "--log.trajectories_per_step=4",
        ]
    )
    assert code == 0
    run = Path(tmp_path) / "learn"
    before = json.loads((run / "eval" / "step_000000.json").read_text())
    after = json.loads((run / "eval" / "step_000015.json").read_text())
    assert after["accuracy"] >= before["accuracy"] + 0.15, (before["accuracy"], after["accuracy"])
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == list(range(1, 16))
    for key in ("reward_mean", "accuracy", "entropy", "grad_norm", "lr", "time_generate_s"):
        assert key in metrics[-1]
    # Sync training never trains on stale tokens; peak memory is logged.
    assert all(m["staleness_max"] == 0 for m in metrics)
    assert metrics[-1]["peak_rss_mb"] >= metrics[0]["peak_rss_mb"] > 100
    # Sync training: every trained token came from the previous step's weights.
    traj = json.loads((run / "trajectories" / "step_000015.jsonl").read_text().splitlines()[0])
    assert set(traj["versions"]) == {14}
    assert len(traj["response_ids"]) == len(traj["loss_mask"]) == len(traj["behaviour_logprobs"])
    assert (run / "report.html").read_text().count("points") == 1
    assert (run / "plots" / "accuracy.png").stat().st_size > 1000
    assert (run / "checkpoints" / "step_15" / "model.safetensors").is_file()
