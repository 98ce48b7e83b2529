"""Rollout-only and train-only modes: each half of a step on its own."""

import json
from pathlib import Path

import pytest
from safetensors.torch import load_file

from quick_run import train
from temper.cli.main import main
from temper.models import resolve_model_path

COMMON = [
    "--orchestrator.steps=2",
    "--orchestrator.prompts_per_step=2",
    "--orchestrator.group_size=4",
    "--orchestrator.drop_zero_variance_groups=false",
    "--log.trajectories_per_step=8",
    "--trainer.lr=1e-3",
    "--checkpoint.at_end=true",  # the weights are compared
]


def _run(root: Path, name: str, *extra: str) -> Path:
    return train(root, name, *COMMON, *extra)


def _weights(run: Path) -> dict:
    return load_file(str(run / "checkpoints" / "step_2" / "model.safetensors"))


@pytest.mark.slow
def test_rollout_only_never_updates_and_train_only_reproduces_the_update(tmp_path):
    full = _run(tmp_path, "full")
    rollout = _run(tmp_path, "rollout", "--orchestrator.mode=rollout_only")
    replayed = _run(
        tmp_path,
        "replayed",
        "--orchestrator.mode=train_only",
        f"--orchestrator.train_from={full / 'trajectories'}",
    )
    # Rollout-only: scored rollouts, no update, weights as shipped.
    metrics = [json.loads(x) for x in (rollout / "metrics.jsonl").read_text().splitlines()]
    assert all("reward_mean" in m and "loss" not in m for m in metrics)
    assert all(m["policy_version"] == 0 for m in metrics)
    shipped = load_file(str(resolve_model_path("tiny") / "model.safetensors"))
    for name, tensor in _weights(rollout).items():
        assert (tensor == shipped[name]).all(), name
    # Train-only on the full run's recorded steps gives the full run's weights.
    metrics = [json.loads(x) for x in (replayed / "metrics.jsonl").read_text().splitlines()]
    assert all("loss" in m and m["tokens_generated"] > 0 for m in metrics)
    a, b = _weights(full), _weights(replayed)
    changed = False
    for name, tensor in a.items():
        assert (tensor - b[name]).abs().max() < 1e-6, name
        changed |= bool((tensor != shipped[name]).any())
    assert changed


def test_train_only_needs_a_source_and_recorded_steps(tmp_path, capsys):
    assert main(["train", "--orchestrator.mode=train_only", f"--run.output_dir={tmp_path}"]) == 2
    assert "orchestrator.train_from is required" in capsys.readouterr().err
    code = main(
        [
            "train",
            f"--run.output_dir={tmp_path}",
            "--orchestrator.mode=train_only",
            f"--orchestrator.train_from={tmp_path / 'none'}",
            "--eval.at_start=false",
            "--log.progress=false",
        ]
    )
    assert code == 2
    assert "no recorded trajectories for step 1" in capsys.readouterr().err
