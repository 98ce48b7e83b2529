"""Progress off a terminal: one plain, unwrapped line per step with an ETA."""

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from temper.errors import ConfigError
from temper.monitor.progress import EVERY_ENV, RunProgress

SRC = Path(__file__).resolve().parents[2] / "src"
TINY_RUN = [
    "--orchestrator.steps=3",
    "--orchestrator.prompts_per_step=4",
    "--orchestrator.group_size=4",
    "--data.eval_size=4",
    "--eval.every=0",
    "--eval.at_start=false",
    "--eval.at_end=false",
    "--checkpoint.at_end=false",
]
METRICS = {"reward_mean": 0.5, "accuracy": 0.25, "gen_tokens_per_s": 1234.0}


def _piped(total: int, **kw) -> tuple[RunProgress, io.StringIO]:
    out = io.StringIO()
    return RunProgress(total, console=Console(file=out), **kw), out


def test_a_pipe_gets_one_plain_line_per_step():
    progress, out = _piped(3)
    with progress:
        for step in (1, 2, 3):
            progress.update(step, METRICS)
    lines = out.getvalue().splitlines()
    assert [line.split()[1] for line in lines] == ["1/3", "2/3", "3/3"]
    for line in lines:
        assert "reward 0.500" in line and "acc 0.250" in line and "1234 tok/s" in line
        assert " eta " in line and "━" not in line  # no bar frame in the log


def test_eta_counts_steps_not_the_start_up_before_them():
    from temper.monitor.progress import PlainProgress

    plain = PlainProgress(total=10, start=0, every_s=0.0, stream=io.StringIO())
    # A start-up reading whose sums round: (16351.012274511 + 110) - 16351.012274511 is
    # 109.99999999999818 in floats (CI once printed 0:01:49 here).
    began = plain._began = 16351.012274511
    # 100 s of start-up (model load, first eval) before step 1, then 10 s per step.
    assert plain.line(1, METRICS, began + 110).endswith("elapsed 0:01:50  eta 0:16:30")
    assert plain.line(2, METRICS, began + 120).endswith("elapsed 0:02:00  eta 0:01:20")
    assert plain.line(4, METRICS, began + 140).endswith("elapsed 0:02:20  eta 0:01:00")


def test_long_messages_are_not_wrapped_and_brackets_are_text():
    progress, out = _piped(2)
    message = "[health] step 1: " + "x" * 150
    with progress:
        progress.log(message)
    assert out.getvalue() == message + "\n"


def test_every_s_thins_the_lines_but_keeps_the_last_step():
    progress, out = _piped(50, every_s=3600.0)
    with progress:
        for step in range(1, 51):
            progress.update(step, METRICS)
    steps = [line.split()[1] for line in out.getvalue().splitlines()]
    assert steps == ["1/50", "50/50"]


def test_disabled_progress_prints_nothing():
    progress, out = _piped(2, enabled=False)
    with progress:
        progress.update(1, METRICS)
        progress.log("hello")
    assert out.getvalue() == ""


def test_a_bad_interval_in_the_environment_is_named(monkeypatch):
    monkeypatch.setenv(EVERY_ENV, "soon")
    with pytest.raises(ConfigError, match=EVERY_ENV):
        _piped(2)


@pytest.mark.slow
def test_temper_train_into_a_file_logs_each_step(tmp_path):
    """A real `temper train` with stdout and stderr going to a file, as under nohup."""
    log = tmp_path / "train.log"
    env = {**os.environ, "PYTHONPATH": str(SRC), "COLUMNS": "80"}
    env.pop(EVERY_ENV, None)
    with log.open("w") as f:
        code = subprocess.call(
            [
                sys.executable,
                "-m",
                "temper.cli.main",
                "train",
                *TINY_RUN,
                f"--run.output_dir={tmp_path}",
            ],
            stdout=f,
            stderr=subprocess.STDOUT,
            cwd=tmp_path,
            env=env,
            timeout=300,
        )
    text = log.read_text()
    assert code == 0, text
    step_lines = [line for line in text.splitlines() if line.startswith("step ")]
    assert [line.split()[1] for line in step_lines] == ["1/3", "2/3", "3/3"], text
    assert all(" tok/s " in line and " eta " in line for line in step_lines)
    assert all(len(line) <= 80 for line in step_lines)


def test_log_progress_every_s_thins_a_real_runs_lines(tmp_path, capsys):
    from temper.cli.main import main

    argv = ["train", f"--run.output_dir={tmp_path}", "--run.name=p", "--orchestrator.steps=3",
            "--orchestrator.prompts_per_step=2", "--orchestrator.group_size=2",
            "--eval.at_start=false", "--eval.at_end=false", "--eval.every=0",
            "--log.progress_every_s=3600"]  # fmt: skip
    assert main(argv) == 0
    steps = [line for line in capsys.readouterr().err.splitlines() if line.startswith("step ")]
    assert [line.split()[1] for line in steps] == ["1/3", "3/3"]  # the first, then the last
