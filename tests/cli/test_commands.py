"""The quickstart config, `temper eval` and `temper generate` run for real."""

import json
import shutil
from pathlib import Path

import pytest

from temper.cli.main import main

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_quickstart_config_runs(tmp_path, monkeypatch):
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    monkeypatch.chdir(tmp_path)
    code = main(
        [
            "train",
            "examples/quickstart/config.toml",
            "--orchestrator.steps=2",
            "--eval.every=0",
            "--eval.size=4",  # the start and end evals on 4 of its 100 held-out tasks
            "--log.progress=false",
        ]
    )
    assert code == 0
    metrics = [
        json.loads(x) for x in Path("runs/quickstart/metrics.jsonl").read_text().splitlines()
    ]
    assert len(metrics) == 2
    # Both reward components are logged separately.
    assert "reward/exact_boxed" in metrics[0] and "reward/format" in metrics[0]


def test_quickstart_holds_out_a_real_eval_set():
    """The quickstart's evals are on a held-out file of 100 problems, none of them trained on."""
    from temper.builder.tasks import build_run_tasks
    from temper.config import load_config

    tasks = build_run_tasks(load_config(ROOT / "examples/quickstart/config.toml"))
    train = {t.prompt for t in tasks.train.tasks}
    assert len(tasks.heldout) == 100
    assert train and not train & {t.prompt for t in tasks.heldout}


def test_eval_command_writes_json(tmp_path, capsys):
    out = tmp_path / "eval.json"
    code = main(["eval", "--eval.size=12", "--eval.k=2", f"--out={out}"])
    assert code == 0
    result = json.loads(out.read_text())
    assert result["n_tasks"] == 12
    assert 0.0 <= result["accuracy"] <= 1.0
    assert result["pass@1"] <= result["pass@2"] <= 1.0
    assert "level1" in result["by_category"]
    assert "eval: 12 tasks" in capsys.readouterr().out


def test_generate_command(capsys):
    code = main(["generate", "What is 2 + 3?", "--n", "2", "--temperature", "1.0", "--seed", "1"])
    assert code == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert [line[:3] for line in lines] == ["[0]", "[1]"]
    assert all("\\boxed{" in line for line in lines)


def test_override_values_written_with_a_space_are_not_taken_for_the_config():
    from temper.cli.main import _parser, join_override_values

    argv = ["eval", "--eval.size", "8", "--eval.k", "2", "--out", "r.json"]
    assert join_override_values(argv) == ["eval", "--eval.size=8", "--eval.k=2", "--out", "r.json"]
    args, extra = _parser().parse_known_args(join_override_values(argv))
    assert args.config is None and args.out == "r.json"
    assert extra == ["--eval.size=8", "--eval.k=2"]
    # A config file still works beside them, and negative values stay values.
    argv = ["train", "my.toml", "--trainer.lr", "-1", "--run.name=x"]
    args, extra = _parser().parse_known_args(join_override_values(argv))
    assert args.config == "my.toml" and extra == ["--trainer.lr=-1", "--run.name=x"]
