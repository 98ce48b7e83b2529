"""`RayWorkerPool`: rollout workers as Ray actors, with `WorkerPool`'s interface and semantics.

Each worker is an async Ray actor (`ray_actor.RayRolloutActor`, a `RolloutWorker`
built inside it) in its own bundle of one placement group (PACK by default:
as few nodes as possible; SPREAD: one per node where possible). Requests go to
the least-loaded actor that is ready and holds the pool's weight version; each
is one actor call, so many run at once in one actor.

One supervisor thread ``ray.wait``s on every outstanding call (requests, weight
loads, pings, start-up) and settles them; it also pings each ready actor every
``heartbeat_timeout_s / 5`` in the actor's health concurrency group.

Fault tolerance (as `WorkerPool`):

- **Dead actor** (`RayActorError`: its process SIGKILLed, OOM-killed, its node
  gone): a new actor takes its slot and bundle (it starts with the newest
  weights); its in-flight requests go back to the front of the queue with
  ``retries + 1``.
- **Hung actor**: nothing heard from it (no result, no ping reply) for
  ``heartbeat_timeout_s`` once ready, or not ready after ``start_timeout_s``:
  ``ray.kill``, then handled as dead.
- A request retried more than ``max_retries`` times fails with `WorkerError`
  naming its task. An actor whose constructor raises at the first start, or
  that fails to start more than ``max_retries`` times in a row, fails the pool.
- **Exactly once**: a result is accepted only from the call the request is
  currently assigned to, and only once; anything else is counted and dropped.

Weights: `set_version` reads the version from the driver's shared-memory ring,
``ray.put``s it once and every actor loads that object (so actors on other
nodes get it too); actors started later get the newest object at start.

Not done: retrying requests that *raised* inside an actor (they fail as in one
process), or outliving the driver (its actors die with its Ray job).
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from temper.backends.ray_actor import HEALTH_GROUP, RayRolloutActor
from temper.backends.routing import Request, SupervisedPool, WorkerError
from temper.backends.worker import BuildWorker
from temper.config import Config
from temper.ray_cluster import import_ray
from temper.weights.choose import ring_reader

#: Concurrent calls one actor runs (the engine batches them; Ray's async default is 1000).
MAX_CONCURRENCY = 1024


@dataclass(eq=False)
class _Actor:
    """The pool's handle on one actor (one slot, one generation)."""

    index: int
    generation: int
    handle: Any
    started_at: float
    last_seen: float
    ready: bool = False
    dead: bool = False
    version: int | None = None
    loading: int | None = None  # the version a load_state call is out for
    threads: int | None = None  # torch threads, as the actor last reported
    pinging: bool = False
    info: dict[str, Any] = field(default_factory=dict)
    in_flight: set[int] = field(default_factory=set)

    @property
    def pid(self) -> int:
        return int(self.info.get("pid", -1))

    def __repr__(self) -> str:
        return f"worker {self.index} (Ray actor, pid {self.pid})"


class RayWorkerPool(SupervisedPool):
    """``n`` supervised rollout actors for ``cfg`` (see the module doc).

    Same public interface as `WorkerPool`: `start` blocks until every actor is
    ready; `submit` / `cancel` / `set_version` may be called from any thread;
    `close` stops everything. Ray must be initialised first (`start_ray`).
    ``ring_root`` is the driver's weight ring (None: versions are numbers only).
    """

    supervisor_name = "Ray rollout supervisor"
    thread_name = "temper-ray"

    def __init__(
        self,
        cfg: Config,
        model_path: str,
        n: int,
        build: BuildWorker,
        *,
        ring_root: str | None,
        heartbeat_timeout_s: float,
        max_retries: int,
        num_cpus: float = 1.0,
        num_gpus: float = 0.0,
        placement: str = "pack",
        start_version: int = 0,
        start_timeout_s: float | None = None,
        log: Callable[[str], None] | None = None,
    ) -> None:
        if placement not in ("pack", "spread"):
            raise ValueError(f"placement must be 'pack' or 'spread', got {placement!r}")
        super().__init__(
            n,
            heartbeat_timeout_s=heartbeat_timeout_s,
            max_retries=max_retries,
            start_version=start_version,
            start_timeout_s=start_timeout_s,
            log=log,
        )
        self.cfg, self.model_path, self.build = cfg, model_path, build
        self.num_cpus, self.num_gpus, self.placement = num_cpus, num_gpus, placement
        self._ring = ring_reader(ring_root) if ring_root is not None else None
        self._ray = import_ray()
        self._actor_cls = self._ray.remote(
            num_cpus=num_cpus,
            num_gpus=num_gpus,
            max_concurrency=MAX_CONCURRENCY,
            concurrency_groups={HEALTH_GROUP: 2},
            max_restarts=0,  # the pool replaces actors itself, with their requests
        )(RayRolloutActor)
        self._pg: Any = None
        # `staged_weights`: the newest published weights in the object store (or None).
        self._calls: dict[Any, tuple[str, _Actor, int]] = {}  # ObjectRef -> (kind, actor, rid)

    # ------------------------------------------------------------ public

    def start(self) -> dict[str, Any]:
        """Place the actors, start them and wait until all are ready; returns the first's info."""
        from ray.util.placement_group import placement_group

        bundle: dict[str, float] = {"CPU": self.num_cpus}
        if self.num_gpus:
            bundle["GPU"] = self.num_gpus
        self._pg = placement_group([dict(bundle)] * self.n, strategy=self.placement.upper())
        try:
            self._ray.get(self._pg.ready(), timeout=self.start_timeout_s)
        except self._ray.exceptions.GetTimeoutError:
            raise WorkerError(
                f"Ray could not place {self.n} rollout worker(s) of {bundle} each "
                f"({self.placement}) within {self.start_timeout_s:.0f}s; the cluster has "
                f"{self._ray.cluster_resources()}"
            ) from None
        return super().start()

    def _stage_weights(self, version: int) -> Any:
        """One copy of ``version`` out of the driver's ring into the object store, shared
        by all actors (None when nothing was published)."""
        if self._ring is None or self._ring.latest_version() is None:
            return None
        state, _ = self._ring.receive(version)
        return self._ray.put(state)

    def _shut_down(self, workers: list[_Actor], timeout_s: float) -> None:
        """Join the supervisor, ask actors to close, kill them after ``timeout_s``, and
        remove the placement group."""
        with self._lock:
            self._calls.clear()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        if self._ray.is_initialized():  # Ray may have shut down first (interpreter exit)
            self._stop_actors(workers, timeout_s)

    def _stop_actors(self, workers: list[_Actor], timeout_s: float) -> None:
        with contextlib.suppress(Exception):
            closing = [w.handle.close.remote() for w in workers if w.ready and not w.dead]
            if closing:
                self._ray.wait(closing, num_returns=len(closing), timeout=timeout_s)
        for w in workers:
            with contextlib.suppress(Exception):
                self._ray.kill(w.handle, no_restart=True)
        if self._pg is not None:
            from ray.util.placement_group import remove_placement_group

            with contextlib.suppress(Exception):
                remove_placement_group(self._pg)

    # ------------------------------------------------------------ internals (hold the lock)

    def _spawn(self, index: int, generation: int) -> _Actor:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        strategy = PlacementGroupSchedulingStrategy(self._pg, placement_group_bundle_index=index)
        handle = self._actor_cls.options(scheduling_strategy=strategy).remote(
            self.cfg, self.model_path, self.target_version, self.staged_weights, self.build
        )
        now = time.monotonic()
        w = _Actor(index, generation, handle, now, now)
        self._calls[handle.info.remote()] = ("ready", w, 0)
        return w

    def _sync_version(self, w: _Actor) -> None:
        target = self.target_version
        if w.ready and not w.dead and w.version != target and w.loading != target:
            w.loading = target
            self._calls[w.handle.load_state.remote(self.staged_weights, target)] = ("weights", w, 0)

    def _send_threads(self, w: _Actor, threads: int) -> None:
        self._calls[w.handle.set_threads.remote(threads)] = ("threads", w, 0)

    def _cancel_sent(self, w: _Actor, req: Request) -> None:
        with contextlib.suppress(Exception):  # already finished, or its actor is gone
            self._ray.cancel(req.ref)

    def _send(self, w: _Actor, req: Request) -> None:
        req.ref = w.handle.groups.remote(req.rid, *req.body)
        self._calls[req.ref] = ("groups", w, req.rid)

    # ------------------------------------------------------------ supervisor thread

    def _watch(self) -> None:
        # New calls join the wait at the next tick: the tick bounds the added latency.
        tick = min(0.05, self.heartbeat_timeout_s / 10)
        while True:
            with self._lock:
                if self._closing:
                    return
                refs = list(self._calls)
            if refs:
                ready, _ = self._ray.wait(refs, num_returns=1, timeout=tick)
                if ready:
                    ready, _ = self._ray.wait(refs, num_returns=len(refs), timeout=0)
            else:
                ready = []
                time.sleep(tick)
            for ref in ready:
                self._settle(ref)
            self._check_health()

    def _settle(self, ref: Any) -> None:
        """Handle one finished call: its value, the error it raised, or its actor's death."""
        exceptions = self._ray.exceptions
        with self._lock:
            entry = self._calls.pop(ref, None)
        if entry is None:
            return  # its actor was already replaced, or the pool is closing
        kind, w, rid = entry
        value: Any = None
        error: BaseException | None = None
        try:
            value = self._ray.get(ref)
        except exceptions.TaskCancelledError:
            with self._lock:
                self.stats.stale_results += 1
            return
        except exceptions.RayTaskError as exc:  # raised inside the actor method
            error = exc.cause if isinstance(exc.cause, BaseException) else exc
        except exceptions.RayError as exc:  # actor died, node lost, object lost
            self._died(w, _reason(exc), hung=False, init_failed=_init_failed(exc))
            return
        with self._lock:
            if w.dead or self._closing:
                return
            w.last_seen = time.monotonic()
            if kind == "groups":
                self._on_result(w, rid, value, error)
            elif kind == "ready":
                self._on_ready(w, value, error)
            elif kind == "weights":
                self._on_weights(w, value, error)
            elif kind == "threads":
                if error is not None:
                    self._fail(WorkerError(f"{w} could not set its threads: {error!r}"))
                else:
                    self._on_threads(w, value)
            else:  # ping
                w.pinging = False

    def _on_result(self, w: _Actor, rid: int, value: Any, error: BaseException | None) -> None:
        req = self._requests.get(rid)
        w.in_flight.discard(rid)
        if req is None or req.worker is not w:
            self.stats.stale_results += 1  # cancelled, or superseded by a retry
            return
        del self._requests[rid]
        self._dispatch()
        req.done(value, error)

    def _on_ready(self, w: _Actor, info: Any, error: BaseException | None) -> None:
        if error is not None:  # info() itself raised: a broken worker, not a dead one
            self._fail(WorkerError(f"rollout {w} failed to start: {error!r}"))
            return
        w.ready, w.info, w.version = True, dict(info), int(info["version"])
        self.stats.failed_starts.pop(w.index, None)
        self._on_worker_ready(w)
        self._dispatch()
        self._lock.notify_all()

    def _on_weights(self, w: _Actor, version: Any, error: BaseException | None) -> None:
        w.loading = None
        if error is not None:
            self._fail(WorkerError(f"{w} could not load weights: {error!r}"))
            return
        w.version = int(version)
        self._sync_version(w)  # a newer version may have been set meanwhile
        self._dispatch()
        self._lock.notify_all()

    def _check_health(self) -> None:
        """Ping ready actors; kill those silent too long (see the module doc)."""
        now = time.monotonic()
        every = self.heartbeat_timeout_s / 5
        late: list[tuple[_Actor, str]] = []
        with self._lock:
            for w in self._workers:
                if w.dead:
                    continue
                if not w.ready:
                    if now - w.started_at > self.start_timeout_s:
                        late.append((w, f"not ready after {now - w.started_at:.1f}s"))
                    continue
                if now - w.last_seen > self.heartbeat_timeout_s:
                    late.append((w, f"no reply for {now - w.last_seen:.1f}s"))
                elif not w.pinging and now - w.last_seen > every:
                    w.pinging = True
                    ping = w.handle.ping.options(concurrency_group=HEALTH_GROUP).remote()
                    self._calls[ping] = ("ping", w, 0)
        for w, why in late:
            self._died(w, why, hung=True)

    def _died(self, w: _Actor, why: str, hung: bool, init_failed: bool = False) -> None:
        """Kill and replace ``w``; requeue its requests or fail those out of retries."""
        with self._lock:
            if w.dead or self._closing:
                return
            w.dead = True
            with contextlib.suppress(Exception):  # a hung actor still runs; a dead one is gone
                self._ray.kill(w.handle, no_restart=True)
            # Its other calls will only report its death again.
            self._calls = {r: e for r, e in self._calls.items() if e[1] is not w}
            self.stats.hung += hung
            if not w.ready and self._error is None:
                self._start_failed(w, why, init_failed)
            if self._error is not None:
                return
            self._retry_and_replace(w, why, hung)


def _reason(exc: BaseException) -> str:
    """Ray's error text on one line: a constructor's exception (the traceback's last
    line), else the start of Ray's text (it names the actor, pid and exit type)."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc))  # Ray colours its text for terminals
    if _init_failed(exc) and (lines := [x for x in text.splitlines() if x.strip()]):
        return lines[-1].strip()
    text = " ".join(text.split())
    return text if len(text) <= 300 else text[:300] + "..."


def _init_failed(exc: BaseException) -> bool:
    return bool(getattr(exc, "actor_init_failed", False))
