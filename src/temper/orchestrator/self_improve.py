"""Self-improvement steps of the synchronous loop: SFT and rejection-sampling fine-tuning.

The loop (`temper.orchestrator.loop`) runs one of these instead of `RLStep` when
``trainer.mode`` is not "rl"; everything around the step (evals, checkpoints,
health checks, resume, metrics files) stays the loop's. Both train with the run's `PolicyTrainer`
(its likelihood loss, `PolicyTrainer._sft_loss`) and publish the new weights
to the engine as version ``step``, like an RL step.

- `SFTSteps` (``"sft"``): each step trains on ``orchestrator.prompts_per_step``
  conversations, drawn in shuffled epochs (a `ListSampler`, checkpointed).
- `RFTRounds` (``"rft"``, expert iteration): each step is a round. It samples
  ``prompts_per_step`` prompts, generates ``group_size`` samples per prompt
  with the engine and scores them with the run's reward (`step_groups`, as an
  RL step does), keeps samples by reward (`keep_samples`), and trains on them.
  A round's state is its step number, the task sampler and the RNG, all in
  the loop's checkpoint; generation seeds depend only on the step, so a
  resumed run repeats the rounds an uninterrupted one runs. Checkpoints fall
  between rounds, never inside one.
"""

from __future__ import annotations

import time
from typing import Any

from temper import compute
from temper.backends.base import RolloutBackend, free_during_train, publish_weights
from temper.config import Config
from temper.config.self_improve import RFTConfig
from temper.data.sampler import ListSampler, TaskSampler
from temper.data.task_sampling import LearnsFromResults
from temper.monitor.profile import stage
from temper.orchestrator.advantages import usable
from temper.orchestrator.collect import step_groups
from temper.orchestrator.rl_step import StepResult, sampling_params
from temper.orchestrator.step_metrics import rollout_metrics
from temper.records import Trajectory
from temper.trainer.base import Trainer


def keep_samples(groups: list[list[Trajectory]], cfg: RFTConfig) -> list[Trajectory]:
    """The samples an RFT round trains on: per group (one prompt), the samples that
    pass ``cfg.keep``, were scored without error and did not hit the length limit
    (they would teach the model not to stop), distinct responses only, highest reward first (ties in
    group order), at most ``cfg.max_per_prompt``."""
    kept: list[Trajectory] = []
    for group in groups:
        passed = [
            t
            for t in usable(group)
            if not t.truncated and t.reward_error is None and _accepted(t, cfg)
        ]
        passed.sort(key=lambda t: -t.reward)  # stable: equal rewards keep group order
        seen: set[tuple[int, ...]] = set()
        for t in passed:
            if len(seen) == cfg.max_per_prompt:
                break
            if tuple(t.response_ids) not in seen:
                seen.add(tuple(t.response_ids))
                kept.append(t)
    return kept


def _accepted(t: Trajectory, cfg: RFTConfig) -> bool:
    return bool(t.correct) if cfg.keep == "correct" else t.reward >= cfg.threshold


class _SupervisedSteps:
    """Train on a list of trajectories, then publish the weights (what every mode shares;
    DPO's steps, `temper.orchestrator.dpo`, train on pairs through the two hooks)."""

    def __init__(self, cfg: Config, trainer: Trainer, backend: RolloutBackend) -> None:
        self.cfg, self.trainer, self.backend = cfg, trainer, backend

    def _update(self, batch: list[Any]) -> dict[str, float]:
        """The trainer's update on ``batch`` (on the compute thread)."""
        return self.trainer.train_step(batch)

    def _tokens(self, batch: list[Any]) -> int:
        """The loss tokens of ``batch``, for the throughput."""
        return sum(t.num_policy_tokens for t in batch)

    async def train(self, trajs: list[Any], step: int) -> dict[str, Any]:
        asleep = free_during_train(self.backend, self.cfg.engine.during_train())
        t0 = time.perf_counter()
        with stage("train"):
            stats = await compute.arun(self._update, trajs) if trajs else {}
        t1 = time.perf_counter()
        if asleep:
            self.backend.wake_up()
        if trajs:
            with stage("weight_sync"):
                publish_weights(self.backend, self.trainer.engine_state_dict(), step)
        trained = self._tokens(trajs) * self.cfg.trainer.ppo_epochs
        return {
            **stats,
            "policy_version": self.backend.version,
            "time_train_s": t1 - t0,
            "time_weight_sync_s": time.perf_counter() - t1,
            # Loss tokens (assistant tokens) trained per second, all passes counted.
            "train_tokens_per_s": trained / max(t1 - t0, 1e-9),
        }


class SFTSteps(_SupervisedSteps):
    """``trainer.mode = "sft"``: supervised steps on rendered conversations."""

    def __init__(
        self, cfg: Config, trainer: Trainer, backend: RolloutBackend, rows: list[Trajectory]
    ) -> None:
        super().__init__(cfg, trainer, backend)
        self.sampler = ListSampler(rows, cfg.run.seed)  # type: ignore[arg-type]

    async def step(self, step: int) -> StepResult:
        t0 = time.perf_counter()
        batch: list[Trajectory] = self.sampler.sample(self.cfg.orchestrator.prompts_per_step)  # type: ignore[assignment]
        m = {"step": step, "samples": len(batch), **await self.train(batch, step)}
        m["time_step_s"] = time.perf_counter() - t0
        return m, batch

    def state_dict(self) -> dict[str, Any]:
        return {"sft_sampler": self.sampler.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sampler.load_state_dict(state["sft_sampler"])


class RFTRounds(_SupervisedSteps):
    """``trainer.mode = "rft"``: generate, keep by reward, train; one round a step."""

    def __init__(
        self, cfg: Config, trainer: Trainer, backend: RolloutBackend, sampler: TaskSampler
    ) -> None:
        super().__init__(cfg, trainer, backend)
        self.sampler = sampler  # the run's task sampler: the loop checkpoints it

    async def step(self, step: int) -> StepResult:
        cfg, o = self.cfg, self.cfg.orchestrator
        t0 = time.perf_counter()
        batch = await step_groups(
            self.backend.rollouts.source,
            self.sampler,
            sampling_params(cfg),
            prompts=o.prompts_per_step,
            seed=cfg.run.seed * 1_000_003 + step,  # the RL loop's seeds: same prompts, samples
            refill=False,
            max_rounds=1,
        )
        flat = [t for g in batch.generated for t in g]
        m: dict[str, Any] = {"step": step, **rollout_metrics(flat)}
        if isinstance(self.sampler, LearnsFromResults):
            self.sampler.observe(step, flat)
            m |= self.sampler.metrics()
        kept = keep_samples(batch.generated, cfg.rft)
        prompts_kept = len({t.group_id for t in kept})
        m.update(
            samples=len(flat),
            reward_errors=int(batch.stats["reward_errors"]),
            time_generate_s=batch.stats["time_generate_s"],
            time_reward_s=batch.stats["time_reward_s"],
            **{
                "rft/kept": len(kept),
                "rft/kept_frac": len(kept) / max(len(flat), 1),
                "rft/prompts_kept_frac": prompts_kept / max(len(batch.generated), 1),
            },
        )
        m.update(await self.train(kept, step))
        m["time_step_s"] = time.perf_counter() - t0
        return m, flat

    def state_dict(self) -> dict[str, Any]:
        return {}  # the step, task sampler and RNG are the loop's own checkpoint state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass
