"""Checkpoints by default: a run SIGKILLed mid-way with the default checkpoint
settings (by wall time, here a tiny interval) resumes from its newest checkpoint and
logs each step once; keep_best keeps the best held-out step beside the newest.
"""

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from temper.cli.main import main
from temper.trainer.checkpoint import best_checkpoint, list_checkpoints

STEPS = 8
ARGS = [
    f"--orchestrator.steps={STEPS}",
    "--orchestrator.prompts_per_step=2",
    "--orchestrator.group_size=2",
    "--orchestrator.max_response_tokens=8",
    "--orchestrator.drop_zero_variance_groups=false",
    "--eval.at_start=false",
    "--eval.every=0",
    "--eval.at_end=false",
    "--log.progress=false",
    "--log.trajectories_per_step=0",
    "--run.threads=1",
    "--checkpoint.every_minutes=0.0001",  # the default cadence, by wall time, at ~6 ms
]


def _steps(run: Path) -> list[int]:
    """Logged steps; a last line without its newline is still being written (or was cut
    by the kill) and is not counted."""
    whole = (run / "metrics.jsonl").read_text().rpartition("\n")[0]
    return [json.loads(x)["step"] for x in whole.splitlines()]


def _wait_for(proc: subprocess.Popen, ready, what: str, timeout_s: float = 120) -> None:
    """Until ``ready()``; fails if the run ends first or the deadline passes."""
    deadline = time.monotonic() + timeout_s
    while not ready():
        assert proc.poll() is None, f"the run ended (exit {proc.returncode}) before {what}"
        assert time.monotonic() < deadline, f"no {what} within {timeout_s}s"
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=0.02)  # returns early if the run ends


@pytest.mark.slow
def test_a_sigkilled_default_run_resumes_from_its_newest_checkpoint(tmp_path, capsys):
    """Killed at a random step: at most one interval is lost (at a ~6 ms cadence every
    step is checkpointed, so at most the step in flight and one logged after its
    checkpoint), and the resumed run logs every step exactly once."""
    kill_at = random.Random().randrange(2, STEPS)
    print(f"SIGKILL once step {kill_at} is logged")  # shown if the test fails
    run = tmp_path / "k"
    common = [f"--run.output_dir={tmp_path}", "--run.name=k", *ARGS]
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.Popen([sys.executable, "-m", "temper.cli.main", "train", *common],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    metrics = run / "metrics.jsonl"
    try:
        _wait_for(proc, lambda: metrics.is_file() and max(_steps(run), default=0) >= kill_at, "it")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    logged = max(_steps(run))
    newest = int(list_checkpoints(run / "checkpoints")[-1].name.split("_")[1])
    assert kill_at <= logged < STEPS and 1 <= newest <= logged
    assert logged - newest <= 1  # one interval at most: the step logged after the checkpoint

    assert main(["train", *common, "--run.resume=true"]) == 0
    assert f"resuming from step {newest} " in capsys.readouterr().err
    assert _steps(run) == list(range(1, STEPS + 1))  # each step once, none repeated


def test_keep_best_keeps_the_best_eval_step_and_the_newest(tmp_path):
    evals = ["--eval.every=1", "--eval.size=2", "--eval.k=1", "--checkpoint.keep=1"]
    code = main(["train", f"--run.output_dir={tmp_path}", "--run.name=b", *ARGS, *evals,
                 "--orchestrator.steps=4"])  # fmt: skip
    assert code == 0
    root = tmp_path / "b" / "checkpoints"
    best = best_checkpoint(root)
    assert best is not None and 1 <= best["step"] <= 4
    evaluated = json.loads((tmp_path / "b" / "eval" / f"step_{best['step']:06d}.json").read_text())
    assert best["accuracy"] == evaluated["accuracy"]
    # checkpoints/best is that step's folder, and loads as a model by its path.
    assert (root / "best").resolve() == (root / f"step_{best['step']}").resolve()
    assert os.readlink(root / "best") == f"step_{best['step']}"  # relative: moves with the run
    from temper.models import load_model

    assert load_model(str(root / "best")) is not None
    kept = [p.name for p in list_checkpoints(root)]
    assert kept == sorted({f"step_{best['step']}", "step_4"}, key=lambda n: int(n[5:]))
