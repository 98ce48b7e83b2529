"""`temper inspect` and `temper compare` over real run directories."""

import json
from pathlib import Path

import pytest

from temper.cli.main import main


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("runs")
    for name, lr in (("a", "1e-4"), ("b", "3e-4")):
        code = main(
            [
                "train",
                f"--run.output_dir={root}",
                f"--run.name={name}",
                f"--trainer.lr={lr}",
                "--orchestrator.steps=2",
                "--orchestrator.prompts_per_step=2",
                "--orchestrator.group_size=4",
                "--eval.every=0",
                "--eval.size=4",
                "--eval.k=2",
                "--log.progress=false",
                "--log.trajectories_per_step=8",
            ]
        )
        assert code == 0
    return root


def test_inspect_ranks_samples_by_reward(two_runs, capsys):
    assert main(["inspect", str(two_runs / "a"), "--step", "2", "--k", "2"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("step 2: 8 saved samples")
    records = [
        json.loads(x)
        for x in (two_runs / "a" / "trajectories" / "step_000002.jsonl").read_text().splitlines()
    ]
    best = max(r["reward"] for r in records)
    worst = min(r["reward"] for r in records)
    best_block, worst_block = out.split("-- best\n")[1].split("-- worst\n")
    assert best_block.startswith(f"reward {best:+.3f}")
    assert worst_block.startswith(f"reward {worst:+.3f}")


def test_inspect_missing_step_is_one_line(two_runs, capsys):
    assert main(["inspect", str(two_runs / "a"), "--step", "9"]) == 2
    err = capsys.readouterr().err
    assert "no trajectories saved at step 9" in err and "[1, 2]" in err


def test_compare_shows_metrics_and_the_config_diff(two_runs, capsys):
    assert main(["compare", str(two_runs / "a"), str(two_runs / "b")]) == 0
    out = capsys.readouterr().out
    assert "reward_mean" in out and "final eval accuracy" in out
    assert "trainer.lr: 0.0001 vs 0.0003" in out
    assert "run.name: 'a' vs 'b'" in out
    assert main(["compare", str(two_runs / "a"), str(two_runs / "nope")]) == 2
