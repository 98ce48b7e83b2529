"""Rollout workers as Ray actors (`RayWorkerPool`): a real local Ray cluster, real kills.

One Ray cluster (2 CPUs) serves the whole session. The built-in tiny model with
per-task seeds samples the same in an actor as in this process, so a group that
was lost, duplicated or resampled after a fault would show.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from temper.backends.remote import RemoteBackend
from temper.backends.routing import WorkerError
from temper.builder.engines import build_engine
from temper.builder.model import RunModel, load_run_model
from temper.builder.rollouts import build_rollouts
from temper.builder.tasks import build_run_tasks, build_tasks
from temper.cli.main import main
from temper.config import config_from_dict
from temper.engine.base import SamplingParams
from temper.errors import ConfigError
from temper.models import load_model, load_tokenizer, resolve_model_path

ray = pytest.importorskip("ray")

from temper.backends.base import publish_weights  # noqa: E402
from temper.backends.ray_pool import RayWorkerPool  # noqa: E402
from temper.builder.backends import build_backend  # noqa: E402
from temper.builder.rollouts import build_worker_parts  # noqa: E402
from temper.ray_cluster import ray_settings  # noqa: E402
from temper.weights import push_weights  # noqa: E402

PARAMS = SamplingParams(n=2, temperature=1.0, max_new_tokens=12)
SEED = 7


def _cfg(name: str, **orchestrator: object) -> object:
    return config_from_dict(
        {
            "run": {"name": name, "threads": 1, "seed": 5},
            "orchestrator": {"rollout_workers": 2, **orchestrator},
        }
    )


def _model_path() -> str:
    return str(resolve_model_path("tiny"))


def _tasks(cfg, n: int) -> list:
    _, heldout = build_tasks(cfg.data, cfg.run.seed)
    assert len(heldout) >= n
    return heldout[:n]


def _samples(groups) -> list[list[tuple]]:
    return [[(t.task_id, tuple(t.response_ids), t.reward) for t in g] for g in groups]


def _wait_for(pred: Callable[[], object], timeout: float = 60.0) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := pred():
            return value
        time.sleep(0.01)
    raise AssertionError("timed out waiting")


def _busy_pid(pool: RayWorkerPool, exclude: set[int]) -> int | None:
    """An actor pid with a request in flight, if any."""
    for pid, n in pool.in_flight().items():
        if n and pid > 0 and pid not in exclude:
            return pid
    return None


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    """Running or stopped (a zombie nobody reaped yet counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state not in ("Z", "X")


def ray_rollouts(cfg, model_path: str) -> RemoteBackend:
    """The run's Ray backend, as the builder starts it."""
    cfg = cfg.model_copy(deep=True)
    cfg.orchestrator.backend = "ray"
    # The weights path as given, even one that does not exist (the actors fail to load it).
    model = RunModel(model_path, _model_path(), load_tokenizer(_model_path()), None, None)
    return build_backend(cfg, model, build_run_tasks(cfg))  # type: ignore[return-value]


def _perturbed_weights() -> dict[str, torch.Tensor]:
    """The tiny model's weights plus fixed noise (they change every sample)."""
    gen = torch.Generator().manual_seed(0)
    state = load_model(_model_path()).state_dict()
    return {k: v + 0.05 * torch.randn(v.shape, generator=gen) for k, v in state.items()}


def _actor_versions(pool: RayWorkerPool) -> list[int]:
    """What the actors themselves report (not the pool's bookkeeping)."""
    return [int(ray.get(w.handle.ping.remote(), timeout=30)["version"]) for w in pool._workers]


@pytest.mark.ray
@pytest.mark.slow
def test_ray_groups_match_local_and_weights_reach_actors(ray_cluster):
    cfg = _cfg("ray-same")
    tasks = _tasks(cfg, 4)
    model = load_run_model(cfg)
    engine = build_engine(cfg, model)
    local = build_rollouts(cfg, engine, model, build_run_tasks(cfg)).source
    remote = ray_rollouts(cfg, _model_path())
    try:
        pids = remote.pool.pids()
        assert len(set(pids)) == 2 and os.getpid() not in pids  # two separate actor processes
        # Rollout actors run at normal priority, not Ray's nice 15 for workers
        # (at 15 they starve beside any other load and never get ready).
        assert [os.getpriority(os.PRIO_PROCESS, pid) for pid in pids] == [0, 0]

        async def both() -> tuple:
            return await local.groups(tasks, PARAMS, SEED), await remote.rollouts.source.groups(
                tasks, PARAMS, SEED
            )

        (want, _), (got, stats) = asyncio.run(both())
        assert _samples(got) == _samples(want)
        assert [t.group_id for g in got for t in g] == [i for i in range(4) for _ in range(2)]
        assert stats["reward_errors"] == 0

        # A cancelled request never calls back; its late or cancelled reply is dropped.
        calls: list = []
        rid = remote.pool.submit(tasks[0].id, ([tasks[0]], PARAMS, None), _recorder(calls, 0))
        remote.pool.cancel(rid)
        _wait_for(lambda: remote.pool.stats.stale_results == 1)

        # New weights: the actors load them from the object store; outputs follow them.
        state = _perturbed_weights()
        publish_weights(remote, state, 1)
        push_weights(engine, state, 1)
        assert remote.version == 1 and _actor_versions(remote.pool) == [1, 1]
        (want1, _), (got1, _) = asyncio.run(both())
        assert _samples(got1) == _samples(want1)
        assert _samples(got1) != _samples(got)  # the weights really changed
        assert {v for g in got1 for t in g for v in t.versions} == {1}
        assert remote.metrics()["workers/restarts_total"] == 0 and calls == []
    finally:
        asyncio.run(remote.close())
        asyncio.run(engine.close())
    assert remote not in RemoteBackend.live()


@pytest.mark.ray
@pytest.mark.slow
def test_killed_and_stopped_actors_are_replaced_and_every_result_arrives_once(ray_cluster):
    """SIGKILL a busy actor; once replaced, SIGSTOP a busy one (heartbeat timeout 3 s)."""
    cfg = _cfg("ray-chaos", heartbeat_timeout_s=3.0, max_retries=3)
    tasks = _tasks(cfg, 8) * 2  # two batches; request i is seeded by i, as RemoteBackend does
    remote = ray_rollouts(cfg, _model_path())
    pool = remote.pool
    calls: list[tuple[int, Any, BaseException | None]] = []
    faults: dict[str, float] = {}

    def submit(batch: range) -> None:
        # Straight to the pool so every callback is seen (a future would hide a second one).
        for i in batch:
            params = replace(PARAMS, seed=SEED * 100003 + i)
            pool.submit(tasks[i].id, ([tasks[i]], params, None), _recorder(calls, i))

    try:
        # Replacements must start holding the published version, not the model's weights.
        publish_weights(remote, _perturbed_weights(), 1)
        reference, _ = asyncio.run(remote.rollouts.source.groups(tasks, PARAMS, SEED))  # fault-free
        submit(range(8))
        killed = _wait_for(lambda: _busy_pid(pool, set()))
        slot, t_kill = pool.pids().index(killed), time.monotonic()
        _kill(killed)
        faults["killed"] = killed
        _wait_for(lambda: pool.stats.restarts >= 1 and pool.pids()[slot] > 0, timeout=90)
        faults["replaced_after_s"] = time.monotonic() - t_kill
        submit(range(8, 16))
        stopped = _wait_for(lambda: _busy_pid(pool, {killed}))
        os.kill(stopped, signal.SIGSTOP)
        faults["stopped"], t_stop = stopped, time.monotonic()
        _wait_for(lambda: stopped not in pool.pids(), timeout=30)
        faults["detected_after_s"] = time.monotonic() - t_stop
        # ray.kill ends a stopped actor process too: no frozen process is left behind.
        _wait_for(lambda: not _alive(stopped), timeout=30)
        faults["stopped_gone_after_s"] = time.monotonic() - t_stop
        _wait_for(lambda: len(calls) >= len(tasks), timeout=120)
        # Every worker has answered all it was sent: a duplicate would have come by now.
        _wait_for(lambda: not any(pool.in_flight().values()), timeout=60)
        m = remote.metrics()
        print("ray chaos:", faults, m, "stale:", pool.stats.stale_results, file=sys.stderr)
    finally:
        if "stopped" in faults:
            _kill(int(faults["stopped"]))  # never leave a stopped process behind
        asyncio.run(remote.close())
    assert sorted(Counter(i for i, _, _ in calls).items()) == [(i, 1) for i in range(len(tasks))]
    assert all(error is None for _, _, error in calls)
    got = {
        i: [(t["task_id"], tuple(t["response_ids"])) for t in r["groups"][0]] for i, r, _ in calls
    }
    want = {i: [(t.task_id, tuple(t.response_ids)) for t in g] for i, g in enumerate(reference)}
    assert got == want  # retried groups were resampled with their own seeds: identical
    assert {v for _, r, _ in calls for t in r["groups"][0] for v in t["versions"]} == {1}
    assert m["workers/restarts_total"] >= 2 and m["workers/hung_total"] >= 1
    assert m["workers/retries_total"] >= 2  # both victims had a request in flight
    assert 2 <= faults["detected_after_s"] < 3 + 5  # the last reply may predate the stop


@pytest.mark.ray
@pytest.mark.slow
def test_worker_threads_change_in_place_and_survive_a_restart(ray_cluster):
    """placement = "auto" moves cores by thread counts: each actor's compute thread
    reports the new count, and a replacement actor is brought to it when it comes up."""
    cfg = _cfg("ray-threads")  # built with run.threads = 1
    remote = ray_rollouts(cfg, _model_path())
    pool = remote.pool

    def threads() -> list[int]:
        return [ray.get(w.handle.ping.remote(), timeout=30)["threads"] for w in pool._workers]

    try:
        assert threads() == [1, 1]
        assert remote.set_worker_threads(2) == [2, 2]
        assert threads() == [2, 2]
        victim = pool.pids()[0]
        _kill(victim)
        _wait_for(lambda: pool.stats.restarts >= 1 and pool._workers[0].ready, timeout=90)
        _wait_for(lambda: pool._workers[0].threads == 2, timeout=30)
        assert threads() == [2, 2]
        tasks = _tasks(cfg, 2)
        groups, _ = asyncio.run(remote.rollouts.source.groups(tasks, PARAMS, SEED))
        assert [len(g) for g in groups] == [2, 2]  # still serving
    finally:
        asyncio.run(remote.close())


def _recorder(calls: list, i: int) -> Callable[[Any, BaseException | None], None]:
    def done(result: Any, error: BaseException | None) -> None:
        calls.append((i, result, error))

    return done


@pytest.mark.ray
@pytest.mark.slow
def test_out_of_retries_raises_worker_error_without_hanging(ray_cluster):
    cfg = _cfg("ray-fails", max_retries=0)
    tasks = _tasks(cfg, 6)
    remote = ray_rollouts(cfg, _model_path())
    started = time.monotonic()
    killer = threading.Thread(
        target=lambda: _kill(_wait_for(lambda: _busy_pid(remote.pool, set()))), daemon=True
    )
    try:
        killer.start()
        with pytest.raises(WorkerError) as info:
            asyncio.run(remote.rollouts.source.groups(tasks, PARAMS, SEED))
    finally:
        killer.join(timeout=30)
        asyncio.run(remote.close())
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("rollout request for task ")
    assert "more than orchestrator.max_retries = 0" in message
    assert remote.metrics()["workers/restarts_total"] >= 1
    assert time.monotonic() - started < 60


@pytest.mark.ray
@pytest.mark.slow
def test_an_actor_that_cannot_build_fails_the_start_at_once(ray_cluster):
    started = time.monotonic()
    with pytest.raises(WorkerError) as info:
        ray_rollouts(_cfg("ray-broken"), "/nonexistent/model")
    assert str(info.value).endswith(
        "failed to start (1x): temper.errors.ModelLoadError: model path "
        "'/nonexistent/model' does not exist"
    )
    assert time.monotonic() - started < 60  # not retried max_retries times
    assert [r for r in RemoteBackend.live() if r.pool.cfg.run.name == "ray-broken"] == []


def test_missing_ray_is_one_line_naming_the_extra(monkeypatch):
    from temper import ray_cluster

    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    with pytest.raises(
        ConfigError,
        match=r"^orchestrator\.backend = 'ray' needs Ray: pip install 'temper-rl\[ray\]'$",
    ):
        ray_cluster.import_ray()


def test_ray_settings_defaults_and_a_bad_placement():
    assert ray_settings(_cfg("x")) == (None, "pack", 1.0)
    with pytest.raises(ValueError, match="placement"):
        RayWorkerPool(
            _cfg("x"),
            "tiny",
            1,
            build_worker_parts,
            ring_root=None,
            heartbeat_timeout_s=1,
            max_retries=0,
            placement="scatter",
        )


def test_ppo_with_a_critic_trains_over_ray_actors(ray_cluster, tmp_path):
    """The critic lives in the trainer: a `temper train` run with Ray rollout actors and
    ``algo.advantage = "gae"`` trains policy and critic every step."""
    args = ["train", f"--run.output_dir={tmp_path}", "--run.name=ppo-ray", "--run.threads=1",
            "--orchestrator.backend=ray", "--orchestrator.rollout_workers=1",
            "--orchestrator.steps=2", "--orchestrator.prompts_per_step=2",
            "--orchestrator.group_size=2", "--orchestrator.max_response_tokens=12",
            "--algo.advantage=gae", "--eval.every=0", "--eval.at_start=false",
            "--eval.at_end=false", "--log.progress=false", "--checkpoint.at_end=false"]  # fmt: skip
    assert main(args) == 0
    rows = [json.loads(x) for x in (tmp_path / "ppo-ray" / "metrics.jsonl").open()]
    assert [r["step"] for r in rows] == [1, 2]
    assert all("value_loss" in r and "loss" in r for r in rows)


def test_trainer_ranks_as_ray_actors_match_one_process(ray_cluster):
    """``trainer.launcher = "ray"``: two FSDP2 ranks as Ray actors (1 CPU each, in a
    placement group) take the same step as one process; a killed rank actor is an
    error naming it."""
    from tests.trainer.test_distributed import CFG, TOL, TOTAL_STEPS, _batch, _max_diff, _weights

    from temper.config.algo import AlgoConfig
    from temper.models import load_model
    from temper.trainer.distributed import DistributedTrainer, TrainerWorkerError
    from temper.trainer.policy_trainer import PolicyTrainer

    plain = PolicyTrainer(load_model("tiny"), CFG, AlgoConfig(), TOTAL_STEPS, pad_id=0)
    plain_stats = plain.train_step(_batch(1))
    cfg = CFG.model_copy(update={"world_size": 2, "launcher": "ray", "ray_num_cpus": 1.0})
    ranks = DistributedTrainer(load_model("tiny"), "tiny", cfg, AlgoConfig(), TOTAL_STEPS, 0)
    try:
        stats = ranks.train_step(_batch(1))
        assert _max_diff(_weights(plain.model), _weights(ranks.model)) < TOL
        for key, value in plain_stats.items():
            assert stats[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key
        ray_cluster.kill(ranks._ranks.actors[1], no_restart=True)
        with pytest.raises(TrainerWorkerError, match="trainer rank 1 \\(a Ray actor\\) died"):
            ranks.train_step(_batch(2))
    finally:
        ranks.close()


def test_lora_and_dpo_trainer_ranks_as_ray_actors_match_one_process(ray_cluster):
    """The two research loops that change what a rank trains, over Ray rank actors: a
    LoRA step trains and hands back the adapters of one process, and a DPO step on pairs
    gives one process's loss, margins and updated margins."""
    from tests.trainer.test_lora_distributed import CFG as LORA_CFG
    from tests.trainer.test_lora_distributed import LORA, TOL, _batch, _gap, _plain
    from tests.trainer.test_preference_trainer import _margins, _pairs, _trainer, _with_reference

    from temper.config.algo import AlgoConfig
    from temper.config.dpo import DPOConfig
    from temper.trainer.distributed import DistributedTrainer

    on_ray = {"world_size": 2, "launcher": "ray", "ray_num_cpus": 1.0}
    plain = _plain(seed=0)
    plain_stats = plain.train_step(_batch(1))
    torch.manual_seed(0)  # the same random A as the plain adapters
    cfg = LORA_CFG.model_copy(update=on_ray)
    ranks = DistributedTrainer(load_model("tiny"), "tiny", cfg, AlgoConfig(), 6, 0, lora=LORA)
    try:
        assert ranks.abilities.adapter
        stats = ranks.train_step(_batch(1))
        update = ranks.engine_state_dict()
    finally:
        ranks.close()
    assert _gap(update, plain.engine_state_dict()) < TOL
    for key in ("loss", "grad_norm"):
        assert stats[key] == pytest.approx(plain_stats[key], rel=1e-4, abs=1e-6), key

    dpo = DPOConfig()
    one = _trainer(load_model("tiny"), dpo, lr=1e-3)
    pairs = _with_reference(one, _pairs())
    one_stats = one.train_pairs(pairs)
    one_after = _margins(one, pairs)
    cfg = one.cfg.model_copy(update=on_ray)
    ranks = DistributedTrainer(load_model("tiny"), "tiny", cfg, AlgoConfig(), 5, 0, dpo=dpo)
    try:
        ranks_stats = ranks.train_pairs(_with_reference(ranks, _pairs()))
        ranks_after = _margins(ranks, pairs)
    finally:
        ranks.close()
    for key in ("dpo/loss", "dpo/margin", "grad_norm"):
        assert ranks_stats[key] == pytest.approx(one_stats[key], rel=1e-4, abs=1e-6), key
    assert ranks_after == pytest.approx(one_after, rel=1e-4, abs=1e-5)
    assert sum(one_after) / len(one_after) > 0  # the step widened the margins from 0
