"""The policy update: recompute logprobs, policy loss (PPO clip, GSPO or CISPO), AdamW step.

Plain PyTorch. One call to `train_step` takes a batch of scored trajectories
(advantages already set; for full REINFORCE++ it turns their outcome rewards
into per-token advantages first, `temper.trainer.objective`), runs `ppo_epochs` passes of `mini_batches` optimizer
steps each, and returns metrics. Each optimizer step accumulates gradients
over micro-batches cut by a padded-token budget, each running its distinct
prompts once for all their responses (`temper.trainer.forward`), or, with
``trainer.packing``, over padding-free packed rows (`temper.trainer.packing`); the loss is
normalised by the mini-batch's global token/sequence counts so accumulation
equals one big batch.

With ``trainer.mode = "sft"`` or ``"rft"`` the same step minimises the
negative log-likelihood of the loss-masked tokens instead (`_sft_loss`: token
mean over the mini-batch, advantages ignored); batching, packing, passes and
mini-batches are the same. With ``"dpo"`` the loop calls `train_pairs` instead,
on chosen/rejected pairs (`temper.trainer.preference`, mixed in).

It does not generate, score or talk to the engine: the orchestrator does that.
With ``algo.advantage = "distill"`` a frozen teacher scores the step's sampled tokens
first, and those scores are the advantages (`temper.trainer.distill`, mixed in).

With ``[lora]`` the model it trains carries peft's LoRA layers (`temper.trainer.lora`,
``adapter``): the optimizer holds only the adapters (the base weights are frozen),
the learning rate is the builder's ``trainer.lr x lora.lr_multiplier``, and what it
publishes, snapshots and checkpoints is the adapter alone.

A few small methods (`_shard`, `_plan`, `_collate`, `_reduce_sums`,
`_clip_grads`) are the seams a data-parallel trainer overrides
(`temper.trainer.dist_worker`): which sequences this process trains on, how
its micro-batches line up with other processes', and how sums and the gradient
norm are combined. Here they keep everything local.
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from temper.algos import (
    aggregate_loss,
    entropy_from_logits,
    kl_estimate,
    masked_moments,
    normalise_over_batch,
    token_logprobs,
)
from temper.algos.off_policy import importance_weights
from temper.config.algo import AlgoConfig
from temper.config.distill import DistillConfig
from temper.config.dpo import DPOConfig
from temper.config.trainer import TrainerConfig
from temper.devices import trainer_precision
from temper.models.vlm_parts import VISION_TOWER_PREFIXES
from temper.records import Trajectory
from temper.trainer.base import TrainerAbilities, TrainerDefaults
from temper.trainer.batching import MicroBatch, PixelSource, collate, plan_micro_batches
from temper.trainer.checkpoint import DCP_DIR, load_dcp_unsharded
from temper.trainer.critic import Critic, critic_stats, gae_targets, whiten
from temper.trainer.distill import Distillation
from temper.trainer.expert_parallel import expert_modules, moe_load, moe_metrics
from temper.trainer.forward import response_logits
from temper.trainer.objective import policy_objective, reinforce_pp_returns
from temper.trainer.optim import build_optimizer
from temper.trainer.packing import (
    PackedMicroBatch,
    collate_packed,
    holds_images,
    packed_logits,
    plan_packed_rows,
)
from temper.trainer.preference import PreferenceTraining
from temper.trainer.step_stats import accumulate_ratio_stats, rl_step_stats, sft_step_stats

if TYPE_CHECKING:  # imports peft: only a run with [lora] loads it
    from temper.trainer.lora import LoraAdapter


class PolicyTrainer(PreferenceTraining, Distillation, TrainerDefaults):
    """Owns the trainable policy, its optimizer and (optionally) a frozen reference and
    a frozen teacher (``algo.advantage = "distill"``)."""

    abilities = TrainerAbilities(undo=True, preference=True)

    def __init__(
        self,
        model: torch.nn.Module,
        cfg: TrainerConfig,
        algo: AlgoConfig,
        total_steps: int,
        pad_id: int,
        ref_model: torch.nn.Module | None = None,
        pixels: PixelSource | None = None,
        critic: Critic | None = None,
        adapter: LoraAdapter | None = None,
        dpo: DPOConfig | None = None,
        teacher: torch.nn.Module | None = None,
        distill: DistillConfig | None = None,
    ) -> None:
        self.model = model
        self.dpo = dpo or DPOConfig()  # trainer.mode = "dpo": its loss and beta
        self.distill = distill or DistillConfig()  # algo.advantage = "distill"
        self.teacher = teacher.eval().requires_grad_(False) if teacher is not None else None
        #: ``[lora]``: the adapters peft put into ``model`` (its only trainable weights).
        self.adapter = adapter
        if adapter is not None:
            self.abilities = TrainerAbilities(undo=True, adapter=True, preference=True)
        #: PPO's value function (``algo.advantage = "gae"``), else None.
        self.critic = critic
        #: Image inputs by hash, for trajectories that hold images (VLMs).
        self.pixels = pixels
        if cfg.freeze_vision_tower:
            freeze_vision_tower(model)
        # Where the model is (build_trainer put it on the configured device).
        self.device = next(model.parameters()).device
        self.precision = trainer_precision(cfg.precision, self.device)
        self.cfg = cfg
        self.algo = algo
        self.pad_id = pad_id
        self.ref_model = ref_model
        if ref_model is not None:
            ref_model.eval().requires_grad_(False)
        optimizer_steps = total_steps * cfg.ppo_epochs * cfg.mini_batches
        self.optimizer, self.scheduler = build_optimizer(model, cfg, optimizer_steps)
        #: MoE layers of the model (0 for a dense one), for the load metrics each step.
        self._moe_layers = len(expert_modules(model))

    def _autocast(self) -> contextlib.AbstractContextManager:
        if self.precision == "bf16":
            return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def _forward_logits(
        self, model: torch.nn.Module, mb: MicroBatch | PackedMicroBatch
    ) -> torch.Tensor:
        with self._autocast():
            if isinstance(mb, PackedMicroBatch):
                return packed_logits(model, mb)
            return response_logits(model, mb)

    def _packs(self, trajs: list[Trajectory]) -> bool:
        """Whether these rows train packed: ``trainer.packing`` on, a text model and no
        images. Vision-language models keep the shared-prompt micro-batches of
        `batching`: their image inputs (and, for some, 3-D rotary positions) are
        matched per prompt and per response, which a packed row does not do."""
        return self.cfg.packing and self.pixels is None and not holds_images(trajs)

    @torch.no_grad()
    def _logprobs_no_grad(
        self,
        model: torch.nn.Module,
        trajs: list[Trajectory],
        rows: list[int] | None = None,
        temperature: float = 1.0,
    ) -> dict[int, torch.Tensor]:
        """Response-token logprobs [R] of ``trajs[i]`` for i in ``rows`` (default: all),
        of ``model``'s logits divided by ``temperature`` (a teacher's; the policy's is 1)."""
        rows = list(range(len(trajs))) if rows is None else rows
        result: dict[int, torch.Tensor] = {}
        for idx in self._plan([trajs[i] for i in rows]):
            batch_rows = [rows[j] for j in idx]
            mb = self._collate(trajs, batch_rows)
            logits = self._forward_logits(model, mb)
            if model is self.model:  # the policy's logits may be a shard of the vocabulary
                lp = mb.to_rows(self._token_logprobs(logits, mb.targets))
            else:
                if temperature != 1.0:
                    logits = logits / temperature
                lp = mb.to_rows(token_logprobs(logits, mb.targets))
            for row, i in enumerate(batch_rows):
                result[i] = lp[row]
        return result

    def _token_logprobs(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The policy's logprobs of ``targets`` from its logits (a seam: with loss
        parallel the logits are this rank's columns of the vocabulary)."""
        return token_logprobs(logits, targets)

    def _entropy(self, logits: torch.Tensor) -> torch.Tensor:
        """The policy's next-token entropies from its logits (the same seam)."""
        return entropy_from_logits(logits)

    # Seams for data parallelism (see the module docstring).
    def _shard(self, trajs: list[Trajectory], chunk: list[int]) -> list[int]:
        """The rows of a mini-batch (indices into the step's trajectories) trained here."""
        return chunk

    def _plan(self, trajs: list[Trajectory]) -> list[list[int]]:
        """Micro-batches of ``trajs`` (lists of positions in it)."""
        if self._packs(trajs):
            return plan_packed_rows(trajs, self.cfg.micro_batch_tokens)
        return plan_micro_batches(
            trajs, self.cfg.micro_batch_tokens, self.cfg.micro_batch_overhead_tokens
        )

    def _collate(self, trajs: list[Trajectory], rows: list[int]) -> MicroBatch | PackedMicroBatch:
        if self._packs([trajs[i] for i in rows]):
            return collate_packed(trajs, rows, self.pad_id).to(self.device)
        return collate(trajs, rows, self.pad_id, self.pixels).to(self.device)

    def _reduce_sums(self, acc: dict[str, float]) -> dict[str, float]:
        """Combine per-process metric sums (``*_max`` keys by max); local: unchanged."""
        return acc

    def _clip_grads(self) -> float:
        """Clip gradients to ``grad_clip`` by global norm; returns the norm before clipping."""
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip)
        return float(norm)

    def train_step(self, trajs: list[Trajectory]) -> dict[str, float]:
        """Update the policy on `trajs`; returns averaged metrics (with an MoE model, its
        routers' load balance too, `temper.trainer.expert_parallel.moe_metrics`)."""
        if not trajs:
            return {}
        with moe_load(self.model) as counts:
            metrics = self._train_step(trajs)
        return {**metrics, **moe_metrics(counts, self._moe_layers, self._reduce_sums)}

    def _train_step(self, trajs: list[Trajectory]) -> dict[str, float]:
        self.model.train()
        order = list(range(len(trajs)))
        chunks = [order[k :: self.cfg.mini_batches] for k in range(self.cfg.mini_batches)]
        chunks = [c for c in chunks if c]
        mine = sorted({i for c in chunks for i in self._shard(trajs, c)})
        rl = self.cfg.mode == "rl"  # sft/rft: a likelihood loss, no old or reference policy
        reward_kl = rl and self.algo.advantage == "reinforce_pp" and self.algo.reward_kl_coef > 0
        needs_old = rl and (self.cfg.ppo_epochs > 1 or self.cfg.mini_batches > 1 or reward_kl)
        old = self._logprobs_no_grad(self.model, trajs, mine) if needs_old else None
        ref = None
        if self.ref_model is not None and rl:
            ref = self._logprobs_no_grad(self.ref_model, trajs, mine)
        sums: dict[str, float] = defaultdict(float)
        counts: dict[str, float] = defaultdict(float)
        token_adv = None
        if rl and self.algo.advantage in ("reinforce_pp", "distill"):
            if self.algo.advantage == "distill":
                token_adv, per_token_stats = self._distill_advantages(trajs, mine)
            else:
                token_adv, per_token_stats = self._reinforce_pp_advantages(trajs, mine, old, ref)
            for name, value in per_token_stats.items():
                sums[name], counts[name] = value, 1.0
        train_policy = True
        if self.critic is not None:
            train_policy = not self.critic.warming_up
            token_adv, value_stats = self._critic_step(trajs, mine, chunks)
            for name, (value, weight) in value_stats.items():
                sums[name], counts[name] = value * weight, weight
        for _epoch in range(self.cfg.ppo_epochs if train_policy else 0):
            for chunk in chunks:
                stats = self._optimizer_step(trajs, chunk, old, ref, token_adv)
                for name, (value, weight) in stats.items():
                    sums[name] += value * weight
                    counts[name] += weight
        return {name: sums[name] / max(counts[name], 1e-12) for name in sums}

    def _critic_step(
        self, trajs: list[Trajectory], rows: list[int], chunks: list[list[int]]
    ) -> tuple[dict[int, torch.Tensor], dict[str, tuple[float, float]]]:
        """PPO with a critic (`temper.trainer.critic`): values at the step's start, GAE
        advantages and returns from them, then the critic's update. Returns the
        advantages the policy trains with (whitened with ``algo.gae_whiten``) and stats."""
        old_values = self.critic.values(self, trajs, rows)
        advantages, returns, mask = gae_targets(self.algo, trajs, rows, old_values)
        diagnostics = critic_stats(old_values, returns, advantages, mask, rows)
        stats = {name: (value, 1.0) for name, value in diagnostics.items()}
        stats["critic_warmup"] = (float(self.critic.warming_up), 1.0)
        stats.update(self.critic.update(self, trajs, chunks, old_values, returns))
        if self.algo.gae_whiten:
            advantages = whiten(self, advantages, mask, rows)
        return {i: a.to(self.device) for i, a in advantages.items()}, stats

    def _reinforce_pp_advantages(
        self,
        trajs: list[Trajectory],
        rows: list[int],
        old: dict[int, torch.Tensor] | None,
        ref: dict[int, torch.Tensor] | None,
    ) -> tuple[dict[int, torch.Tensor], dict[str, float]]:
        """Full REINFORCE++'s per-token advantages [R_i] of ``trajs[i] for i in rows``.

        The orchestrator left each trajectory's outcome reward in ``advantage``
        (`compute_advantages("reinforce_pp")`); here the KL of the policy at the
        step's start (``old``) to the reference joins the reward token by token,
        and the returns are normalised over the whole step's batch: the moments
        are summed over processes (`_reduce_sums`), so every rank normalises alike.
        """
        returns, mask, kl = reinforce_pp_returns(self.algo, trajs, rows, old, ref)
        count, total, total_sq = masked_moments(returns, mask)
        kl_sum = float((kl * mask).sum())
        sums = self._reduce_sums(
            {"rpp_count": count, "rpp_sum": total, "rpp_sum_sq": total_sq, "rpp_kl": kl_sum}
        )
        moments = (sums["rpp_count"], sums["rpp_sum"], sums["rpp_sum_sq"])
        adv = normalise_over_batch(returns, mask, moments)
        per_row = {i: adv[k, : len(trajs[i].response_ids)] for k, i in enumerate(rows)}
        stats = {"reward_kl": sums["rpp_kl"] / max(sums["rpp_count"], 1.0)}
        return per_row, stats

    def _optimizer_step(
        self,
        trajs: list[Trajectory],
        chunk: list[int],
        old: dict[int, torch.Tensor] | None,
        ref: dict[int, torch.Tensor] | None,
        token_adv: dict[int, torch.Tensor] | None = None,
    ) -> dict[str, tuple[float, float]]:
        """One optimizer step over ``trajs[i] for i in chunk``; stats map name -> (value, weight).

        The loss is normalised by the whole mini-batch's token and sequence counts,
        whichever rows this process runs, so gradients add up across micro-batches
        and processes to the gradient of the whole mini-batch.
        """
        batch = [trajs[i] for i in chunk]
        totals = (float(sum(t.num_policy_tokens for t in batch)), float(len(batch)))
        acc: dict[str, float] = defaultdict(float)
        self.optimizer.zero_grad(set_to_none=True)
        self._backward(trajs, self._shard(trajs, chunk), old, ref, totals, acc, token_adv)
        acc = self._reduce_sums(dict(acc))
        grad_norm = self._clip_grads()
        lr = self.scheduler.get_last_lr()[0]
        if math.isfinite(grad_norm):
            self.optimizer.step()
        self.scheduler.step()
        if self.cfg.mode != "rl":
            return sft_step_stats(acc, totals[0], grad_norm, lr)
        kl_logged = ref is not None and self.algo.kl_coef > 0
        return rl_step_stats(acc, totals[0], grad_norm, lr, kl_logged)

    def _backward(
        self,
        trajs: list[Trajectory],
        mine: list[int],
        old: dict[int, torch.Tensor] | None,
        ref: dict[int, torch.Tensor] | None,
        totals: tuple[float, float],
        acc: dict[str, float],
        token_adv: dict[int, torch.Tensor] | None,
    ) -> None:
        """Accumulate the gradients of rows ``mine`` of a mini-batch, micro-batch by
        micro-batch (a seam: pipeline parallelism runs them through its schedule)."""
        for idx in self._plan([trajs[i] for i in mine]):
            rows = [mine[j] for j in idx]
            mb = self._collate(trajs, rows)
            logits = self._forward_logits(self.model, mb)
            self._loss(mb, logits, trajs, rows, old, ref, totals, acc, token_adv).backward()

    def _loss(
        self,
        mb: MicroBatch | PackedMicroBatch,
        logits: torch.Tensor,
        trajs: list[Trajectory],
        rows: list[int],
        old: dict[int, torch.Tensor] | None,
        ref: dict[int, torch.Tensor] | None,
        totals: tuple[float, float],
        acc: dict[str, float],
        token_adv: dict[int, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """The loss of micro-batch ``mb`` (rows ``rows``) from its ``logits``, summable
        across micro-batches; adds its stats to ``acc``.

        ``token_adv``: per-token advantages by row (full REINFORCE++), replacing the
        trajectories' own."""
        if self.cfg.mode != "rl":
            return self._sft_loss(mb, logits, totals, acc)
        logprobs = mb.to_rows(self._token_logprobs(logits, mb.targets))
        fresh = [(row, trajs[i]) for row, i in enumerate(rows) if trajs[i].trainer_logprobs is None]
        if fresh:  # first pass: the weights the engine sampled with; one copy to host
            host = logprobs.detach().tolist()
            for row, t in fresh:
                t.trainer_logprobs = host[row][: len(t.response_ids)]
        if old is not None:
            old_lp = _stack_rows([old[i] for i in rows], logprobs)
        else:
            old_lp = logprobs.detach()
        # "behaviour": PPO around the engine's logprobs; otherwise around the proximal
        # policy, with importance weights pi_prox / mu (temper.algos.off_policy).
        correction = self.algo.off_policy_correction
        anchor = mb.behaviour_logprobs if correction == "behaviour" else old_lp
        advantages = mb.advantages
        if token_adv is not None:
            advantages = _stack_rows([token_adv[i] for i in rows], logprobs)
        mask = mb.loss_mask
        per_token, clip_stats = policy_objective(self.algo, logprobs, anchor, advantages, mask)
        n_tok = float(mask.sum())
        weights, is_stats = importance_weights(
            old_lp,
            mb.behaviour_logprobs,
            mask,
            correction,
            level=self.algo.is_level,
            cap=self.algo.is_cap,
            low=self.algo.is_low,
        )
        if weights is not None:
            per_token = per_token * weights
        n_seq = float((mask.sum(dim=-1) > 0).sum())
        accumulate_ratio_stats(acc, {**clip_stats, **is_stats}, n_tok, n_seq)
        if ref is not None and self.algo.kl_coef > 0:
            ref_lp = _stack_rows([ref[i] for i in rows], logprobs)
            kl = kl_estimate(logprobs, ref_lp, kind=self.algo.kl_estimator)
            per_token = per_token + self.algo.kl_coef * kl
            acc["kl"] += float((kl.detach() * mask).sum())
        if (full_kl := self._full_kl_term(mb, logits)) is not None:  # distill, "full"
            per_token = per_token + self.distill.coef * full_kl
            acc["distill_full_kl"] += float((full_kl.detach() * mask).sum())
        if self.algo.entropy_coef > 0:
            ent = mb.to_rows(self._entropy(logits))
            per_token = per_token - self.algo.entropy_coef * ent
        else:
            with torch.no_grad():
                ent = mb.to_rows(self._entropy(logits))
        loss = aggregate_loss(
            per_token, mask, self.algo.loss_agg, total_tokens=totals[0], total_seqs=totals[1]
        )
        acc["loss"] += float(loss.detach())
        acc["entropy"] += float((ent.detach() * mask).sum())
        diff = (logprobs.detach() - mb.behaviour_logprobs).abs() * mask
        acc["mismatch_abs"] += float(diff.sum())
        acc["mismatch_max"] = max(acc["mismatch_max"], float(diff.max()) if n_tok else 0.0)
        return loss

    def _sft_loss(
        self,
        mb: MicroBatch | PackedMicroBatch,
        logits: torch.Tensor,
        totals: tuple[float, float],
        acc: dict[str, float],
    ) -> torch.Tensor:
        """Negative log-likelihood of the loss-masked tokens of ``mb``, over the
        mini-batch's token count ``totals[0]`` (so micro-batches add up to its mean)."""
        logprobs = mb.to_rows(self._token_logprobs(logits, mb.targets))
        loss = aggregate_loss(-logprobs, mb.loss_mask, "token-mean", total_tokens=totals[0])
        acc["loss"] += float(loss.detach())
        return loss

    def engine_state_dict(self) -> dict[str, torch.Tensor]:
        """Current weights, detached, for publishing to engines; with ``[lora]`` the
        adapter alone (`temper.weights.adapter`)."""
        if self.adapter is not None:
            return self.adapter.update()
        return {k: v.detach() for k, v in self.model.state_dict().items()}

    def saved_model(self) -> Any:
        """The HF model, or with ``[lora]`` peft's (a checkpoint then holds the adapter)."""
        return self.model if self.adapter is None else self.adapter.peft_model

    def snapshot(self) -> dict:
        """A copy of the weights and optimizer/scheduler state, for `restore` (a skipped
        step); with ``[lora]`` only the adapters' weights (the rest never changes)."""
        weights = self.model.state_dict() if self.adapter is None else self.adapter.trainable()
        return {
            "model": {k: v.detach().clone() for k, v in weights.items()},
            "trainer": copy.deepcopy(self.state_dict()),
        }

    def restore(self, snapshot: dict) -> None:
        """Undo everything since `snapshot`: weights, optimizer and scheduler state."""
        with torch.no_grad():
            self.model.load_state_dict(snapshot["model"], strict=self.adapter is None)
        self.load_state_dict(snapshot["trainer"])

    def state_dict(self) -> dict:
        state = {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict()}
        if self.critic is not None:
            state["critic"] = self.critic.state_dict()
        return state

    def load_checkpoint(self, ckpt: Path, trainer_state: dict[str, Any]) -> None:
        """Restore from checkpoint ``ckpt``: a DCP checkpoint (written by sharded ranks of
        any world size) through `load_dcp_unsharded`, a plain one through `load_state_dict`
        (the HF weights were loaded with the model; with ``[lora]`` the adapter is read
        from the checkpoint here, over the base weights the model was loaded with)."""
        if self.adapter is not None:
            self.adapter.load(ckpt)
        if trainer_state.get("format") == "dcp":
            load_dcp_unsharded(
                self.model, self.optimizer, ckpt / DCP_DIR, adapter_only=self.adapter is not None
            )
            self.scheduler.load_state_dict(trainer_state["scheduler"])
        else:
            self.load_state_dict(trainer_state)

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if self.critic is not None:
            self.critic.load_state_dict(state.get("critic"))


def _stack_rows(rows: list[torch.Tensor], like: torch.Tensor) -> torch.Tensor:
    """Stack per-trajectory [R_i] tensors into ``like``'s shape, zero-padding on the right."""
    out = torch.zeros(like.shape, dtype=torch.float32)
    for r, row in enumerate(rows):
        n = min(row.shape[0], like.shape[1])
        out[r, :n] = row[:n]
    return out.to(like.device)


def freeze_vision_tower(model: torch.nn.Module) -> int:
    """Stop gradients into a VLM's vision encoder; returns how many tensors it froze
    (0 for a text model). The optimizer is built after, so it never holds them."""
    frozen = 0
    for name, param in model.named_parameters():
        if name.startswith(VISION_TOWER_PREFIXES):
            param.requires_grad_(False)
            frozen += 1
    return frozen
