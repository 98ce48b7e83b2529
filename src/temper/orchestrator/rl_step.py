"""One RL step, in five named stages: collect → advantages → train → publish → metrics.

- **collect**: this step's scored groups: recorded (``mode = "train_only"``), taken
  from the background (async, `temper.orchestrator.async_rollouts`), or generated
  now (`temper.orchestrator.collect`, with refill). The task sampler sees every
  group generated.
- **advantages**: each kept trajectory's advantage (`temper.orchestrator.advantages`);
  a served distillation teacher (``distill.teacher = URL``) then scores their tokens
  (`temper.rollout.remote_teacher`).
- **train**: the engine frees its memory when it shares the machine (synchronous
  runs), the trainer updates the policy; a health check with action "skip" may
  undo the update before anything is published.
- **publish**: the new weights go to every engine as version ``step``.
- **metrics**: rewards, lengths, stage times, staleness, and what the loop adds
  about the system (placement, workers, memory, env counters).

The loop (`temper.orchestrator.loop`) runs a step and everything around it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from temper import compute
from temper.backends.base import RolloutBackend, free_during_train, publish_weights
from temper.config import Config
from temper.data.sampler import TaskSampler
from temper.data.task_sampling import LearnsFromResults
from temper.engine.base import SamplingParams
from temper.monitor.health import Alert, HealthMonitor
from temper.monitor.profile import stage
from temper.orchestrator.advantages import assign_advantages
from temper.orchestrator.async_rollouts import AsyncRollouts
from temper.orchestrator.collect import step_groups
from temper.orchestrator.run_dir import load_recorded_groups
from temper.orchestrator.step_metrics import (
    rollout_metrics,
    rollout_seconds,
    stage_times,
    staleness_metrics,
)
from temper.records import Trajectory
from temper.rollout.remote_teacher import RemoteTeacher
from temper.rollout.sources import Groups
from temper.trainer.base import Trainer

#: What a step gives the loop: its metrics and the trajectories it generated or trained on.
StepResult = tuple[dict[str, Any], list[Trajectory]]


def sampling_params(cfg: Config) -> SamplingParams:
    """The sampling of a training step's groups (``orchestrator.*``)."""
    o = cfg.orchestrator
    return SamplingParams(
        n=o.group_size,
        temperature=o.temperature,
        top_p=o.top_p,
        top_k=o.top_k,
        max_new_tokens=o.max_response_tokens,
    )


class RLStep:
    """The RL step of a run (``trainer.mode = "rl"``). ``system_metrics`` is the loop's
    own part of a step's metrics; ``async_rollouts`` is set once rollouts run ahead."""

    def __init__(
        self,
        cfg: Config,
        trainer: Trainer,
        backend: RolloutBackend,
        sampler: TaskSampler,
        health: HealthMonitor,
        system_metrics: Callable[[list[Trajectory]], dict[str, Any]],
        teacher: RemoteTeacher | None = None,
    ) -> None:
        self.cfg, self.trainer, self.backend, self.sampler = cfg, trainer, backend, sampler
        #: A served distillation teacher: it scores the kept trajectories before training.
        self.teacher = teacher
        self.health, self.system_metrics = health, system_metrics
        self.async_rollouts: AsyncRollouts | None = None
        #: This step's alerts when they were checked before publishing (a "skip" check).
        self.alerts: list[Alert] | None = None

    async def step(self, step: int) -> StepResult:
        t0 = time.perf_counter()
        version_before = self.backend.version
        groups, generated, rollout_stats, extra = await self.collect(step)
        flat = [t for g in generated for t in g]
        t_collected = time.perf_counter()
        kept, dropped = self.advantages(groups)
        if self.teacher is not None and self.trains(kept):
            with stage("teacher"):
                await self.teacher.score(kept)
        train_stats, snapshot, asleep = await self.train(kept)
        t_trained = time.perf_counter()
        await self.publish(
            step, self.trains(kept), flat, train_stats, rollout_stats, snapshot, asleep
        )
        t_published = time.perf_counter()
        counts = (len(groups) - dropped, len(generated) - len(groups) + dropped)
        m = self.metrics(step, flat, train_stats, rollout_stats, counts)
        m.update(stage_times(rollout_stats, t0, t_collected, t_trained, t_published))
        m.update(staleness_metrics(flat, version_before))
        m.update(extra)
        m.update(self.system_metrics(flat))
        return m, flat

    async def collect(self, step: int) -> tuple[Groups, Groups, dict, dict]:
        """(groups to train on, all generated, rollout stats, extra metrics)."""
        cfg = self.cfg
        if cfg.orchestrator.mode == "train_only":
            groups, stats = load_recorded_groups(cfg.orchestrator.train_from, step)
            return groups, groups, stats, {}
        if self.async_rollouts is not None:
            groups, stats = await self.async_rollouts.take(step)
            generated, extra = groups, {}
        else:
            batch = await step_groups(
                self.backend.rollouts.source,
                self.sampler,
                sampling_params(cfg),
                prompts=cfg.orchestrator.prompts_per_step,
                seed=cfg.run.seed * 1_000_003 + step,
                refill=cfg.orchestrator.refill,
                max_rounds=cfg.orchestrator.max_refill_rounds,
            )
            groups, generated, stats, extra = (
                batch.train,
                batch.generated,
                batch.stats,
                batch.metrics,
            )
        if isinstance(self.sampler, LearnsFromResults):
            self.sampler.observe(step, [t for g in generated for t in g])  # every group
            extra = {**extra, **self.sampler.metrics()}
        return groups, generated, stats, extra

    def advantages(self, groups: Groups) -> tuple[list[Trajectory], int]:
        """(trajectories to train on, with their advantages; groups dropped)."""
        a = self.cfg.algo
        drop = self.cfg.orchestrator.drop_zero_variance_groups
        return assign_advantages(groups, a.advantage, drop, a.credit, a.turn_discount)

    def trains(self, kept: list[Trajectory]) -> bool:
        return bool(kept) and self.cfg.orchestrator.mode != "rollout_only"

    async def train(self, kept: list[Trajectory]) -> tuple[dict[str, Any], dict | None, bool]:
        """(train metrics, a snapshot to undo the update with or None, whether the engine
        sleeps). With async rollouts the engine keeps generating while the trainer
        steps, so it keeps its memory."""
        during = "keep" if self.async_rollouts else self.cfg.engine.during_train()
        asleep = free_during_train(self.backend, during)
        snapshot = None
        if self.trains(kept) and self.health.may_skip:  # a "skip" check may undo it
            snapshot = await compute.arun(self.trainer.snapshot)
        with stage("train"):
            stats = await compute.arun(self.trainer.train_step, kept) if self.trains(kept) else {}
        return stats, snapshot, asleep

    async def publish(
        self,
        step: int,
        trained: bool,
        flat: list[Trajectory],
        train_stats: dict[str, Any],
        rollout_stats: dict[str, float],
        snapshot: dict | None,
        asleep: bool,
    ) -> None:
        """The new weights to every engine, as version ``step``, unless a "skip" health
        check undoes the update first; a sleeping engine wakes first."""
        self.alerts = None
        if snapshot is not None:
            trained = await self._check_before_publish(
                step, flat, train_stats, rollout_stats, snapshot
            )
        if asleep:
            self.backend.wake_up()
        if not trained:
            return
        with stage("weight_sync"):
            publish_weights(self.backend, self.trainer.engine_state_dict(), step)
        if self.async_rollouts is not None:
            self.async_rollouts.weights_updated(step)

    def metrics(
        self,
        step: int,
        flat: list[Trajectory],
        train_stats: dict[str, Any],
        rollout_stats: dict[str, float],
        groups: tuple[int, int],
    ) -> dict[str, Any]:
        """The step's rollout and train metrics; ``groups`` = (kept, dropped)."""
        m: dict[str, Any] = {"step": step, **rollout_metrics(flat), **train_stats}
        m.update(
            groups_kept=groups[0],
            groups_dropped=groups[1],
            samples=len(flat),
            reward_errors=int(rollout_stats["reward_errors"]),
            policy_version=self.backend.version,
            gen_tokens_per_s=m["tokens_generated"] / max(rollout_seconds(rollout_stats), 1e-9),
        )
        return m

    async def _check_before_publish(
        self,
        step: int,
        flat: list[Trajectory],
        train_stats: dict[str, Any],
        rollout_stats: dict[str, float],
        snapshot: dict,
    ) -> bool:
        """Run the health checks before the new weights go out; False if a "skip" undid them."""
        probe = {**rollout_metrics(flat), **train_stats}
        probe["gen_tokens_per_s"] = probe["tokens_generated"] / max(
            rollout_seconds(rollout_stats), 1e-9
        )
        self.alerts = self.health.check(step, probe)
        if not any(a.action == "skip" for a in self.alerts):
            return True
        await compute.arun(self.trainer.restore, snapshot)
        train_stats["update_skipped"] = 1.0
        return False

    def state_dict(self) -> dict[str, Any]:
        return {}  # the step, task sampler and RNG are the loop's own checkpoint state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass
