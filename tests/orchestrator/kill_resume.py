"""The kill-and-resume protocol the resume tests share: run `temper train` to the end
as "full", run it again as "killed" and SIGKILL it once its step-2 checkpoint is on
disk, resume "killed", then compare the two runs' metrics step by step."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def train_cmd(args: list[str], out: Path, name: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "temper.cli.main", "train", *args,
            f"--run.output_dir={out}", f"--run.name={name}", "--run.threads=1", *extra]  # fmt: skip


def full_then_killed_and_resumed(args: list[str], out: Path, *extra: str) -> None:
    """Leave ``out/full`` (uninterrupted) and ``out/killed`` (killed after step 2, resumed).

    The uninterrupted run goes alongside the other: each is mostly one busy core, and
    nothing of one (run directory, shared-memory names, ports) is the other's."""
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    full = subprocess.Popen(train_cmd(args, out, "full", *extra), env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # fmt: skip
    proc = subprocess.Popen(train_cmd(args, out, "killed", *extra), env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    marker = out / "killed" / "checkpoints" / "step_2" / "state.json"
    deadline = time.time() + 240
    while not marker.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    assert marker.exists(), "the run never wrote its step-2 checkpoint"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    resumed = subprocess.run(
        train_cmd(args, out, "killed", *extra, "--run.resume=true"),
        env=env,
        capture_output=True,
        text=True,
    )
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    full_err = full.communicate()[1]
    assert full.returncode == 0, full_err[-2000:]


def step_metrics(path: Path, volatile: tuple[str, ...]) -> dict[int, dict]:
    """metrics.jsonl by step, without the keys that differ between runs (timings)."""
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return {r["step"]: {k: v for k, v in r.items() if not k.startswith(volatile)} for r in rows}
