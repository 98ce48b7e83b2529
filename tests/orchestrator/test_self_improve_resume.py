"""SFT and RFT runs SIGKILLed after a checkpoint and resumed log the same metrics as
uninterrupted runs with the same seed: the SFT data position, the RFT round (the step),
the task sampler and the RNG all come back from the checkpoint."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ARGS = [
    "--orchestrator.steps=3",
    "--orchestrator.prompts_per_step=4",
    "--orchestrator.group_size=4",
    "--orchestrator.max_response_tokens=24",
    "--trainer.lr=5e-4",
    "--trainer.warmup_steps=1",
    "--trainer.packing=true",
    "--eval.at_start=false",
    "--eval.every=0",
    "--eval.size=8",
    "--eval.k=1",
    "--checkpoint.every=2",
    "--log.progress=false",
    "--run.seed=3",
]
MODES = {
    # 10 conversations, 4 a step: step 3 crosses an epoch boundary of the data.
    "sft": ["--trainer.mode=sft", "--sft.size=10"],
    "rft": ["--trainer.mode=rft", "--rft.max_per_prompt=2", "--sampler.type=targeted"],
}
VOLATILE = ("time_", "train_tokens_per_s", "peak_rss")


def _cmd(out: Path, name: str, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "temper.cli.main",
        "train",
        *ARGS,
        f"--run.output_dir={out}",
        f"--run.name={name}",
        *extra,
    ]


def _metrics(path: Path) -> dict[int, dict]:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return {r["step"]: {k: v for k, v in r.items() if not k.startswith(VOLATILE)} for r in rows}


@pytest.mark.parametrize("mode", sorted(MODES))
def test_sigkill_and_resume_matches_uninterrupted(tmp_path, mode):
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    extra = MODES[mode]
    subprocess.run(_cmd(tmp_path, "full", *extra), check=True, env=env, capture_output=True)
    proc = subprocess.Popen(
        _cmd(tmp_path, "killed", *extra),
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    marker = tmp_path / "killed" / "checkpoints" / "step_2" / "state.json"
    deadline = time.time() + 240
    while not marker.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    assert marker.exists(), "the run never wrote its step-2 checkpoint"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    resumed = subprocess.run(
        _cmd(tmp_path, "killed", *extra, "--run.resume=true"),
        env=env,
        capture_output=True,
        text=True,
    )
    assert resumed.returncode == 0, resumed.stderr[-2000:]

    full = _metrics(tmp_path / "full" / "metrics.jsonl")
    again = _metrics(tmp_path / "killed" / "metrics.jsonl")
    assert sorted(again) == [1, 2, 3]
    key = "nll_per_token" if mode == "sft" else "rft/kept_frac"
    assert key in full[3]
    for step in (3,):
        assert again[step].keys() == full[step].keys()
        for name, value in full[step].items():
            assert again[step][name] == pytest.approx(value, rel=1e-5, abs=1e-9), (step, name)
    final_full = json.loads((tmp_path / "full" / "eval" / "step_000003.json").read_text())
    final_again = json.loads((tmp_path / "killed" / "eval" / "step_000003.json").read_text())
    assert final_again["accuracy"] == final_full["accuracy"]
