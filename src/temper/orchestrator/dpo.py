"""DPO steps of the synchronous loop (``trainer.mode = "dpo"``), beside SFT and RFT.

Both train with the run's trainer through `Trainer.train_pairs`
(`temper.trainer.preference`) and publish the new weights as version ``step``,
as the other self-improvement steps do (`temper.orchestrator.self_improve`).

- `DPOSteps` (``dpo.pairs = "dataset"``): each step trains on
  ``orchestrator.prompts_per_step`` pairs of the `[dpo]` dataset, drawn in
  shuffled epochs. The reference is the starting policy, without a second model:
  before the first step (or the first eval) one no-grad pass of the policy as
  loaded computes every training and held-out pair's reference logprob sums, and
  they are kept, in the checkpoint too (a resumed run's policy is no longer the
  reference). Each eval adds the held-out pairs' preference accuracy
  (`heldout_preference`).
- `OnlineDPORounds` (``dpo.pairs = "online"``): each step samples
  ``prompts_per_step`` of the run's tasks, generates ``group_size`` samples each
  and scores them with the run's reward (`step_groups`, as an RFT round does),
  pairs the best against the worst sample of each group (`pair_groups`), takes
  their reference sums from the trainer's frozen reference model (the starting
  weights, loaded beside the policy) and trains.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from temper import compute
from temper.algos.preference import preference_stats
from temper.backends.base import RolloutBackend
from temper.config import Config
from temper.data.sampler import ListSampler, TaskSampler
from temper.data.task_sampling import LearnsFromResults
from temper.orchestrator.advantages import usable
from temper.orchestrator.collect import step_groups
from temper.orchestrator.rl_step import StepResult, sampling_params
from temper.orchestrator.self_improve import _SupervisedSteps
from temper.orchestrator.step_metrics import rollout_metrics
from temper.records import Trajectory
from temper.trainer.base import Trainer
from temper.trainer.preference import ResponsePair, pair_rows


def pair_groups(groups: list[list[Trajectory]]) -> list[ResponsePair]:
    """One pair per group: its highest-reward sample (the first of equals, in group
    order) against its lowest (the last of equals), over the samples scored without
    error. A group whose rewards are all equal, or whose two ends are the same
    response, gives none."""
    pairs = []
    for group in groups:
        scored = [t for t in usable(group) if t.reward_error is None]
        if len(scored) < 2:
            continue
        best = max(scored, key=lambda t: t.reward)
        worst = min(reversed(scored), key=lambda t: t.reward)
        if best.reward > worst.reward and best.response_ids != worst.response_ids:
            pairs.append(ResponsePair(best, worst))
    return pairs


class _PairSteps(_SupervisedSteps):
    """Train on pairs (the hooks of `_SupervisedSteps`)."""

    def _update(self, batch: list[Any]) -> dict[str, float]:
        return self.trainer.train_pairs(batch)

    def _tokens(self, batch: list[Any]) -> int:
        return sum(t.num_policy_tokens for t in pair_rows(batch))

    async def _reference(self, pairs: list[ResponsePair], reference: bool) -> None:
        """Fill in ``pairs``' reference sums: from the policy now, or (``reference``)
        the frozen reference model; on the compute thread, like every trainer call."""
        sums = await compute.arun(self.trainer.sequence_logprobs, pair_rows(pairs), reference)
        for k, p in enumerate(pairs):
            p.ref_chosen, p.ref_rejected = sums[2 * k], sums[2 * k + 1]


class DPOSteps(_PairSteps):
    """``dpo.pairs = "dataset"``: DPO steps on the `[dpo]` pairs (module docstring)."""

    def __init__(
        self,
        cfg: Config,
        trainer: Trainer,
        backend: RolloutBackend,
        pairs: list[ResponsePair],
        heldout: list[ResponsePair],
    ) -> None:
        super().__init__(cfg, trainer, backend)
        self.pairs, self.heldout = pairs, heldout
        self.sampler = ListSampler(pairs, cfg.run.seed)  # type: ignore[arg-type]

    async def _ensure_reference(self) -> None:
        """The reference sums of every pair, once, from the policy before any update. The
        held-out pairs are scored on their own, as `heldout_preference` scores them, so
        at step 0 the policy's sums equal the reference's bit for bit (the micro-batches
        depend only on their rows; other rows next to them would move the last bits)."""
        for pairs in (self.pairs, self.heldout):
            if any(p.ref_chosen is None for p in pairs):
                await self._reference(pairs, reference=False)

    async def step(self, step: int) -> StepResult:
        t0 = time.perf_counter()
        await self._ensure_reference()
        batch: list[ResponsePair] = self.sampler.sample(self.cfg.orchestrator.prompts_per_step)  # type: ignore[assignment]
        m = {"step": step, "samples": 2 * len(batch), "dpo/pairs": len(batch)}
        m.update(await self.train(batch, step))
        m["time_step_s"] = time.perf_counter() - t0
        return m, pair_rows(batch)

    async def heldout_preference(self) -> dict[str, float]:
        """The held-out pairs under the policy now: ``preference_accuracy`` (the share
        whose implicit reward beta x (pi - ref) is higher for the chosen response, ties
        not counted: 0 at the reference itself), ``preference_margin`` (the mean reward
        margin), ``preference_kl`` (pi - ref per chosen token) and
        ``preference_logp_accuracy`` (the share whose chosen response has the higher
        summed logprob under the policy alone, meaningful from step 0)."""
        await self._ensure_reference()
        pi = await compute.arun(self.trainer.sequence_logprobs, pair_rows(self.heldout))
        pi_c, pi_r = torch.tensor(pi[0::2]), torch.tensor(pi[1::2])
        ref_c = torch.tensor([p.ref_chosen for p in self.heldout])
        ref_r = torch.tensor([p.ref_rejected for p in self.heldout])
        tokens = torch.tensor([float(p.chosen.num_policy_tokens) for p in self.heldout])
        stats = preference_stats(pi_c, pi_r, ref_c, ref_r, self.cfg.dpo.beta, tokens)
        return {
            "preference_accuracy": float(stats["reward_accuracy"]),
            "preference_margin": float(stats["margin"]),
            "preference_kl": float(stats["kl"]),
            "preference_logp_accuracy": float((pi_c > pi_r).float().mean()),
            "preference_pairs": len(self.heldout),
        }

    def state_dict(self) -> dict[str, Any]:
        # The reference sums come from the starting policy, which a resumed run no
        # longer has: they are checkpointed with the sampler.
        reference = [[p.ref_chosen, p.ref_rejected] for p in [*self.pairs, *self.heldout]]
        return {"dpo_sampler": self.sampler.state_dict(), "dpo_reference": reference}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sampler.load_state_dict(state["dpo_sampler"])
        for p, (c, r) in zip([*self.pairs, *self.heldout], state["dpo_reference"], strict=True):
            p.ref_chosen, p.ref_rejected = c, r


class OnlineDPORounds(_PairSteps):
    """``dpo.pairs = "online"``: generate, pair best against worst, DPO; one round a step."""

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
        pairs = pair_groups(batch.generated)
        if pairs:
            await self._reference(pairs, reference=True)
        m.update(
            samples=len(flat),
            reward_errors=int(batch.stats["reward_errors"]),
            time_generate_s=batch.stats["time_generate_s"],
            time_reward_s=batch.stats["time_reward_s"],
            **{
                "dpo/pairs": len(pairs),
                "dpo/pairs_frac": len(pairs) / max(len(batch.generated), 1),
            },
        )
        m.update(await self.train(pairs, step))
        m["time_step_s"] = time.perf_counter() - t0
        return m, flat

    def state_dict(self) -> dict[str, Any]:
        return {}  # the step, task sampler and RNG are the loop's own checkpoint state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass
