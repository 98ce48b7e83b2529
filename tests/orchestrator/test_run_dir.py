"""The run directory is never lost by mistake: real `temper train` runs on the tiny model.

Overwrite only after validation, failed starts that never block a retry,
resume rules, unwritable and full output directories, Ctrl-C, and leftovers
of a checkpoint write that was killed.
"""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from temper.cli.main import main

SHORT = [
    "--orchestrator.steps=1",
    "--orchestrator.prompts_per_step=2",
    "--orchestrator.group_size=4",
    "--orchestrator.max_response_tokens=16",
    "--orchestrator.drop_zero_variance_groups=false",
    "--eval.at_start=false",
    "--eval.every=0",
    "--eval.at_end=false",
    "--log.progress=false",
    "--log.trajectories_per_step=0",
]


def _train(out: Path, name: str, *extra: str) -> int:
    return main(["train", f"--run.output_dir={out}", f"--run.name={name}", *SHORT, *extra])


def _steps(run: Path) -> list[int]:
    return [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()]


def _one_line_error(err: str) -> str:
    lines = err.strip().splitlines()
    assert "Traceback" not in err
    assert lines[-1].startswith("temper: error: ")
    return lines[-1]


def _old_run(root: Path, name: str = "old") -> Path:
    run = root / name
    (run / "checkpoints").mkdir(parents=True)
    (run / "metrics.jsonl").write_text('{"step": 1, "reward_mean": 0.5}\n')
    (run / "config.toml").write_text("[run]\nname = 'old'\n")
    return run


@pytest.mark.parametrize(
    "bad",
    [
        "--model.path=/no/such/model",
        '--reward.components=[{type="python",function="no_such_module_xyz:f"}]',
        "--orchestrator.group_size=1",
    ],
)
def test_overwrite_keeps_the_old_run_when_the_new_start_is_invalid(tmp_path, capsys, bad):
    run = _old_run(tmp_path)
    assert _train(tmp_path, "old", "--run.overwrite=true", bad) == 2
    _one_line_error(capsys.readouterr().err)
    assert (run / "metrics.jsonl").read_text() == '{"step": 1, "reward_mean": 0.5}\n'


@pytest.mark.parametrize(
    "bad",
    [
        "--data.path=/no/such/data.jsonl",
        '--reward.components=[{type="python",function="no_such_module_xyz:f"}]',
    ],
)
def test_overwrite_with_rollout_workers_checks_data_and_reward_first(tmp_path, capsys, bad):
    # Rollout workers write their pid files into the run directory, so it is made before
    # they start; the data and the reward functions are checked before that.
    run = _old_run(tmp_path)
    argv = ["--run.overwrite=true", "--orchestrator.backend=process", "--data.type=file", bad]
    if "data.path" not in bad:
        argv.append(f"--data.path={_words(tmp_path)}")
    assert _train(tmp_path, "old", *argv) == 2
    _one_line_error(capsys.readouterr().err)
    assert (run / "metrics.jsonl").read_text() == '{"step": 1, "reward_mean": 0.5}\n'


def _words(tmp_path) -> str:
    data = tmp_path / "words.jsonl"
    rows = [{"prompt": f"say {w}", "answer": w} for w in ("red", "green", "blue") * 10]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(data)


def test_what_a_failed_start_left_does_not_block_the_retry(tmp_path):
    # What the old code left after a start that failed past RunDir.prepare.
    run = tmp_path / "retry"
    for sub in ("checkpoints", "eval", "trajectories", "plots"):
        (run / sub).mkdir(parents=True)
    (run / "config.toml").write_text("[run]\n")
    (run / "events.jsonl").write_text("")
    assert _train(tmp_path, "retry", "--checkpoint.at_end=false") == 0
    assert _steps(run) == [1]


def test_a_start_that_fails_on_its_data_leaves_no_directory(tmp_path, capsys):
    # A prompt longer than the tiny model's context fails the start once the data is read
    # (the old code had made the run directory by then, which blocked the retry).
    data = tmp_path / "long.jsonl"
    rows = [{"prompt": f"{i} + 1 = ?", "answer": str(i + 1)} for i in range(9)]
    rows.append({"prompt": "word " * 5000, "answer": "1"})
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    code = _train(tmp_path, "long", "--data.type=file", f"--data.path={data}",
                  f"--data.eval_path={data}")  # fmt: skip
    assert code == 2
    assert "longer than the model context" in _one_line_error(capsys.readouterr().err)
    assert not (tmp_path / "long").exists()


def test_resume_of_a_missing_run_fails_unless_auto(tmp_path, capsys):
    assert _train(tmp_path, "missing", "--run.resume=true") == 2
    line = _one_line_error(capsys.readouterr().err)
    assert "run.resume" in line and "does not exist" in line and '"auto"' in line
    assert not (tmp_path / "missing").exists()
    assert _train(tmp_path, "missing", '--run.resume="auto"', "--checkpoint.at_end=false") == 0
    assert _steps(tmp_path / "missing") == [1]


@pytest.mark.slow
def test_resume_without_a_checkpoint_fails_and_auto_starts_clean(tmp_path, capsys):
    # A run interrupted by the old code: metrics but no checkpoint.
    run = _old_run(tmp_path, "nockpt")
    assert _train(tmp_path, "nockpt", "--run.resume=true") == 2
    assert "has no checkpoint" in _one_line_error(capsys.readouterr().err)
    assert _train(tmp_path, "nockpt", "--run.resume=auto", "--checkpoint.at_end=false") == 0
    assert _steps(run) == [1]  # started clean: step 1 once, not twice


@pytest.mark.slow
def test_resume_says_so_records_a_changed_config_and_cleans_partial_checkpoints(tmp_path, capsys):
    run = tmp_path / "r"
    assert _train(tmp_path, "r") == 0  # 1 step, checkpoint at the end
    capsys.readouterr()
    partial = run / "checkpoints" / ".step_2.k1ll3d"  # a write that was SIGKILLed
    partial.mkdir()
    (partial / "model.safetensors").write_bytes(b"half")
    assert _train(tmp_path, "r", "--run.resume=true", "--orchestrator.steps=2") == 0
    err = capsys.readouterr().err
    assert f"resuming from step 1 ({run / 'checkpoints' / 'step_1'})" in err
    assert "orchestrator.steps: 1 -> 2" in err
    assert _steps(run) == [1, 2]
    assert not partial.exists()
    # config.toml still tells what steps 1.. ran with; the change is recorded beside it.
    assert "steps = 1\n" in (run / "config.toml").read_text()
    assert "steps = 2\n" in (run / "config.resumed_step_1.toml").read_text()
    resumed = [json.loads(x) for x in (run / "events.jsonl").read_text().splitlines()]
    [event] = [e for e in resumed if e["kind"] == "resumed"]
    assert event["config_changes"] == {"orchestrator.steps": [1, 2]}


def test_an_output_dir_that_is_a_file_gives_one_line(tmp_path, capsys):
    (tmp_path / "afile").write_text("")
    assert _train(tmp_path / "afile", "x") == 2
    assert "is a file, not a directory" in _one_line_error(capsys.readouterr().err)


@contextlib.contextmanager
def _mounted_tmpfs(where: Path, options: str):
    """A real tmpfs at ``where`` (skips the test where mounting is not allowed)."""
    where.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], capture_output=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def test_a_read_only_output_dir_gives_one_line(tmp_path, capsys):
    with _mounted_tmpfs(tmp_path / "ro", "ro,size=1m") as ro:
        assert _train(ro, "x") == 2
        line = _one_line_error(capsys.readouterr().err)
    assert line == f"temper: error: run.output_dir: cannot write {ro} (read-only file system)"


def test_a_full_disk_gives_one_line_and_keeps_earlier_checkpoints(tmp_path, capsys):
    # 18 MiB holds one checkpoint of the tiny model (~14 MB) but not two.
    with _mounted_tmpfs(tmp_path / "small", "size=18m") as small:
        code = _train(small, "full", "--orchestrator.steps=2", "--checkpoint.every=1",
                      "--checkpoint.keep=2")  # fmt: skip
        line = _one_line_error(capsys.readouterr().err)
        assert code == 2
        assert "no space left on device" in line and str(small / "full") in line
        assert (small / "full" / "checkpoints" / "step_1" / "state.json").is_file()
        assert not list((small / "full" / "checkpoints").glob(".step_*"))


@pytest.mark.slow
def test_sigint_writes_a_final_checkpoint_and_resume_never_repeats_a_step(tmp_path, capsys):
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, "-m", "temper.cli.main", "train", f"--run.output_dir={tmp_path}",
           "--run.name=int", *SHORT, "--orchestrator.steps=200", "--checkpoint.every=0"]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics = tmp_path / "int" / "metrics.jsonl"
    deadline = time.time() + 120
    while proc.poll() is None and time.time() < deadline:
        if metrics.is_file() and metrics.read_text().count("\n") >= 1:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    done = _steps(tmp_path / "int")
    last = done[-1]
    assert f"temper: interrupted at step {last} (checkpoint step_{last} written)" in err
    assert (tmp_path / "int" / "checkpoints" / f"step_{last}" / "state.json").is_file()
    code = _train(tmp_path, "int", f"--orchestrator.steps={last + 1}", "--run.resume=true")
    assert code == 0
    assert f"resuming from step {last}" in capsys.readouterr().err
    assert _steps(tmp_path / "int") == list(range(1, last + 2))
