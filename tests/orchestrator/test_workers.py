"""Rollout workers as separate processes (orchestrator.backend = "process").

Real worker processes, real SIGKILL / SIGSTOP. The tiny model with seeded
single-turn groups makes the same samples in a worker as in one process, so a
run with faults must train on exactly what a local run trains on: any group
lost, duplicated or resampled would show.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from quick_run import QUIET, train
from quick_run import metrics as read_metrics
from temper.backends.remote import RemoteBackend
from temper.cli.main import main
from temper.config import load_config
from temper.errors import ConfigError
from temper.monitor.sinks import truncate_jsonl_after_step

STEPS, PROMPTS, GROUP = 3, 4, 4
COMMON = [
    f"--orchestrator.steps={STEPS}",
    f"--orchestrator.prompts_per_step={PROMPTS}",
    f"--orchestrator.group_size={GROUP}",
    "--orchestrator.max_response_tokens=16",
    "--orchestrator.drop_zero_variance_groups=false",
    f"--log.trajectories_per_step={PROMPTS * GROUP}",
    "--trainer.lr=1e-3",
    "--run.seed=5",
    "--run.threads=1",  # 2 shared cores: one torch thread per process is fastest
    *QUIET,
]
PROCESS = ["--orchestrator.backend=process", "--orchestrator.rollout_workers=2"]


def _run(root: Path, name: str, *extra: str) -> Path:
    return train(root, name, *COMMON, *extra)


def _trajectories(run: Path, step: int) -> list[dict]:
    path = run / "trajectories" / f"step_{step:06d}.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()]


def _alive(pid: int) -> bool:
    """Running (a zombie nobody reaped yet counts as dead)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state not in ("Z", "X")


def _worker_pids(run: Path) -> list[int]:
    return [int(p.read_text()) for p in sorted((run / "workers").glob("worker_*.pid"))]


def _wait_for(pred: Callable[[], object], timeout: float = 120.0) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := pred():
            return value
        time.sleep(0.02)
    raise AssertionError("timed out waiting")


def _busy_worker(rollouts: RemoteBackend, exclude: set[int]) -> int | None:
    """A worker pid with a group request in flight, if any."""
    for pid, n in rollouts.pool.in_flight().items():
        if n and pid not in exclude:
            return pid
    return None


def _assert_same_training_data(run: Path, reference: Path) -> None:
    """Every step trained exactly PROMPTS groups of GROUP samples, the reference's samples."""
    for step in range(1, STEPS + 1):
        got, want = _trajectories(run, step), _trajectories(reference, step)
        assert Counter(t["group_id"] for t in got) == {g: GROUP for g in range(PROMPTS)}
        assert [t["task_id"] for t in got] == [t["task_id"] for t in want]
        assert [t["response_ids"] for t in got] == [t["response_ids"] for t in want]


# Evaluation changes no training state; the comparison test checks it goes through workers too.
EVAL = ["--eval.at_end=true", "--eval.size=8", "--eval.k=2"]


@pytest.fixture(scope="module")
def local_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _run(tmp_path_factory.mktemp("local"), "local", *EVAL)


@pytest.mark.slow
def test_process_backend_trains_like_local(tmp_path, local_run):
    run = _run(tmp_path, "process", *PROCESS, *EVAL)
    local, remote = read_metrics(local_run), read_metrics(run)
    evals = [
        json.loads((r / "eval" / f"step_{STEPS:06d}.json").read_text()) for r in (local_run, run)
    ]
    for key in ("accuracy", "pass@1", "pass@2", "mean@2"):
        assert evals[1][key] == pytest.approx(evals[0][key]), key
    assert [m["step"] for m in remote] == list(range(1, STEPS + 1))
    for a, b in zip(local, remote, strict=True):
        assert b["policy_version"] == b["step"] and b["groups_kept"] == PROMPTS
        assert b["reward_mean"] == pytest.approx(a["reward_mean"], abs=1e-9)
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-3, abs=1e-5)
        assert b["workers/restarts_total"] == 0 and b["workers/retries_total"] == 0
    _assert_same_training_data(run, local_run)
    assert len(_worker_pids(run)) == 2
    assert not any(_alive(pid) for pid in _worker_pids(run))


@pytest.mark.slow
def test_killed_and_stopped_workers_are_replaced_and_nothing_is_lost(tmp_path, local_run):
    """SIGKILL one busy worker, later SIGSTOP the other one while busy (heartbeat timeout 3 s)."""
    faults: dict[str, float | int] = {}

    def chaos() -> None:
        rollouts = _wait_for(RemoteBackend.live)[0]
        killed = _wait_for(lambda: _busy_worker(rollouts, set()))
        slot = rollouts.pool.pids().index(killed)
        os.kill(killed, signal.SIGKILL)
        faults["killed"] = killed
        _wait_for(lambda: rollouts.pool.stats.restarts >= 1 and rollouts.version >= 1)
        replacement = rollouts.pool.pids()[slot]
        stopped = _wait_for(lambda: _busy_worker(rollouts, {killed, replacement}))
        os.kill(stopped, signal.SIGSTOP)
        faults["stopped"], faults["stopped_at"] = stopped, time.monotonic()
        _wait_for(lambda: stopped not in rollouts.pool.pids(), timeout=30)
        faults["detected_after_s"] = time.monotonic() - faults["stopped_at"]

    thread = threading.Thread(target=chaos, daemon=True)
    thread.start()
    try:
        run = _run(tmp_path, "chaos", *PROCESS, "--orchestrator.heartbeat_timeout_s=3")
    finally:
        thread.join(timeout=60)
        for key in ("killed", "stopped"):  # never leave a stopped worker behind
            if key in faults and _alive(int(faults[key])):
                os.kill(int(faults[key]), signal.SIGKILL)
    assert {"killed", "stopped", "detected_after_s"} <= faults.keys(), faults
    assert 2 <= faults["detected_after_s"] < 3 + 5  # the last beat may predate the stop
    last = read_metrics(run)[-1]
    print("chaos:", faults, {k: v for k, v in last.items() if k.startswith("workers/")})
    assert last["workers/restarts_total"] >= 2
    assert last["workers/hung_total"] >= 1
    assert last["workers/retries_total"] >= 2  # both victims had a request in flight
    assert [m["groups_kept"] for m in read_metrics(run)] == [PROMPTS] * STEPS
    _assert_same_training_data(run, local_run)  # nothing lost, duplicated or resampled
    assert not any(_alive(pid) for pid in _worker_pids(run))


@pytest.mark.slow
def test_out_of_retries_fails_the_run_with_one_line(tmp_path, capsys):
    killed: list[int] = []

    def kill_busy_worker() -> None:
        rollouts = _wait_for(RemoteBackend.live)[0]
        pid = _wait_for(lambda: _busy_worker(rollouts, set()))
        os.kill(pid, signal.SIGKILL)
        killed.append(pid)

    thread = threading.Thread(target=kill_busy_worker, daemon=True)
    thread.start()
    started = time.monotonic()
    code = main(
        [
            "train",
            f"--run.output_dir={tmp_path}",
            "--run.name=fails",
            *COMMON,
            "--orchestrator.backend=process",
            "--orchestrator.max_retries=0",
        ]
    )
    thread.join(timeout=10)
    assert killed and code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("temper: error: rollout request for task ")
    assert "more than orchestrator.max_retries = 0" in err and "SIGKILL" in err
    assert time.monotonic() - started < 120
    assert RemoteBackend.live() == []
    assert not any(_alive(pid) for pid in _worker_pids(tmp_path / "fails"))


@pytest.mark.slow
def test_async_rollouts_run_on_worker_processes(tmp_path):
    run = _run(tmp_path, "async", *PROCESS, "--orchestrator.max_staleness=1")
    metrics = read_metrics(run)
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1))
    for m in metrics:
        assert m["policy_version"] == m["step"] and m["groups_kept"] == PROMPTS
        assert m["staleness_max"] <= 1 and "async/in_flight" in m
        assert m["workers/restarts_total"] == 0
    for step in range(1, STEPS + 1):
        for t in _trajectories(run, step):
            sampled = [v for v, keep in zip(t["versions"], t["loss_mask"], strict=True) if keep]
            assert all(step - 2 <= v <= step - 1 for v in sampled)
    assert not any(_alive(pid) for pid in _worker_pids(run))


@pytest.mark.slow
def test_sigkilled_trainer_resumes_and_its_workers_exit(tmp_path, local_run):
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    cmd = [
        sys.executable,
        "-m",
        "temper.cli.main",
        "train",
        f"--run.output_dir={tmp_path}",
        "--run.name=resumed",
        *COMMON,
        "--orchestrator.backend=process",
        "--checkpoint.every=1",
    ]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    run = tmp_path / "resumed"
    try:
        _wait_for(lambda: (run / "checkpoints" / "step_1" / "state.json").exists(), timeout=240)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    workers = _worker_pids(run)
    assert workers
    # Orphaned workers see their pipe close and exit on their own.
    _wait_for(lambda: not any(_alive(pid) for pid in workers), timeout=15)

    resumed = subprocess.run([*cmd, "--run.resume=true"], env=env, capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    metrics = read_metrics(run)
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1))
    for a, b in zip(read_metrics(local_run), metrics, strict=True):
        assert b["reward_mean"] == pytest.approx(a["reward_mean"], abs=1e-9)
    for step in range(1, STEPS + 1):
        assert len(_trajectories(run, step)) == PROMPTS * GROUP  # whole JSONL lines
    assert not any(_alive(pid) for pid in _worker_pids(run))
    assert not list(Path("/dev/shm").glob("temper-ring-resumed-*"))  # the killed run's too


def test_resume_drops_a_metrics_line_cut_by_a_kill(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n{"step": 2}\n{"step": 3, "lo')
    truncate_jsonl_after_step(path, 2)
    assert path.read_text() == '{"step": 1}\n{"step": 2}\n'
    path.write_text('{"step": 1}\n{"ste\n{"step": 2}\n')
    with pytest.raises(json.JSONDecodeError):
        truncate_jsonl_after_step(path, 2)


def test_process_backend_options_are_checked():
    cfg = load_config(None, ["--orchestrator.backend=process"])
    o = cfg.orchestrator
    assert (o.rollout_workers, o.heartbeat_timeout_s, o.max_retries) == (1, 30.0, 3)
    assert load_config(None, []).orchestrator.backend == "local"
    for bad, field in [
        ("--orchestrator.backend=k8s", "backend"),
        ("--orchestrator.rollout_workers=0", "rollout_workers"),
        ("--orchestrator.heartbeat_timeout_s=0", "heartbeat_timeout_s"),
        ("--orchestrator.max_retries=-1", "max_retries"),
    ]:
        with pytest.raises(ConfigError, match=rf"orchestrator\.{field}"):
            load_config(None, [bad])
