"""PPO's critic: a learned value per response token, GAE targets from it, and its update.

`Critic` owns the value function (``critic.kind``: a separate value model or a
linear head on the policy, `temper.config.critic`), its own AdamW and
schedule, and the warm-up count. `PolicyTrainer.train_step` calls it in this
order each step (``algo.advantage = "gae"``):

1. `values` at the step's start, no gradient: the "old" values;
2. `gae_targets`: advantages and value targets (returns) from the rewards and
   those values (`temper.algos.value`);
3. `update`: ``ppo_epochs`` passes of ``mini_batches`` critic steps on the
   clipped value loss, before the policy's update (so a head's cached
   features are still the policy's);
4. the policy's update with those advantages, unless still warming up.

The value of response token j is read where the logits for token j come from
(the state before it), through the trainer's own forward and batching: a
value model is a causal LM whose output layer has one unit, so its "logits"
are values; a head reads the policy's last hidden state, which
`hidden_states_as_logits` makes the policy's forward return instead of logits.
"""

from __future__ import annotations

import copy
import warnings
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol

import torch

from temper.algos import aggregate_loss, masked_moments, normalise_over_batch
from temper.algos.turn_credit import episode_turn_rewards, token_advantages
from temper.algos.value import explained_variance, gae, turn_gae, value_loss
from temper.config.algo import AlgoConfig
from temper.config.critic import CriticConfig
from temper.config.trainer import TrainerConfig
from temper.records import Trajectory
from temper.trainer.batching import MicroBatch
from temper.trainer.optim import build_optimizer
from temper.trainer.packing import PackedMicroBatch

Rows = dict[int, torch.Tensor]  # one [R_i] tensor per trajectory index


class PolicyBatching(Protocol):
    """What the critic uses of `temper.trainer.policy_trainer.PolicyTrainer`: the policy,
    its config, and its batching and forward seams (so the critic batches, shards and
    runs exactly as the policy does, at any world size)."""

    model: torch.nn.Module
    cfg: TrainerConfig

    def _plan(self, trajs: list[Trajectory]) -> list[list[int]]: ...
    def _collate(self, trajs: list[Trajectory], rows: list[int]) -> Any: ...
    def _forward_logits(self, model: torch.nn.Module, mb: Any) -> torch.Tensor: ...
    def _shard(self, trajs: list[Trajectory], chunk: list[int]) -> list[int]: ...
    def _reduce_sums(self, acc: dict[str, float]) -> dict[str, float]: ...


def as_value_model(model: torch.nn.Module) -> torch.nn.Module:
    """Turn a causal LM into a value model, in place: its output layer becomes one
    zero-initialised linear unit (with bias), untied from the input embeddings, so
    every value starts at 0."""
    hidden = model.get_output_embeddings().in_features
    for cfg in (model.config, getattr(model.config, "text_config", None)):
        if cfg is not None:
            cfg.tie_word_embeddings = False
    head = torch.nn.Linear(hidden, 1, bias=True)
    torch.nn.init.zeros_(head.weight)
    torch.nn.init.zeros_(head.bias)
    param = next(model.parameters())
    model.set_output_embeddings(head.to(device=param.device, dtype=param.dtype))
    return model


@contextmanager
def hidden_states_as_logits(model: torch.nn.Module) -> Iterator[None]:
    """Within this block ``model``'s forward returns, in place of its logits, the last
    hidden states its output layer was given (``[..., hidden]``), at the same positions."""
    handle = model.get_output_embeddings().register_forward_hook(lambda _m, args, _out: args[0])
    try:
        yield
    finally:
        handle.remove()


def _split_rows(
    mb: MicroBatch | PackedMicroBatch, per_token: torch.Tensor, lengths: list[int]
) -> list[torch.Tensor]:
    """Per-row ``[R_i, ...]`` slices of a micro-batch's per-token output: ``[B, R, ...]``,
    or flat ``[N, ...]`` (rows in order) for a packed one."""
    if isinstance(mb, PackedMicroBatch):
        return list(torch.split(per_token, mb.valid.sum(dim=1).tolist()))
    return [per_token[b, :n] for b, n in enumerate(lengths)]


class Critic:
    """The value function of PPO with a critic, its optimizer and its warm-up count."""

    def __init__(
        self,
        cfg: CriticConfig,
        trainer_cfg: TrainerConfig,
        policy: torch.nn.Module,
        value_model: torch.nn.Module | None,
        optimizer_steps: int,
    ) -> None:
        self.cfg = cfg
        if cfg.kind == "model":
            if value_model is None:
                raise ValueError("critic.kind = 'model' needs a value model")
            self.module = as_value_model(value_model).train()
        else:
            param = next(policy.parameters())
            hidden = policy.get_output_embeddings().in_features
            self.module = torch.nn.Linear(hidden, 1).to(param.device)
            torch.nn.init.zeros_(self.module.weight)
            torch.nn.init.zeros_(self.module.bias)
        opt_cfg = trainer_cfg.model_copy(
            update={"lr": cfg.lr or min(10 * trainer_cfg.lr, 1.0), "grad_clip": cfg.grad_clip}
        )
        self.optimizer, self.scheduler = build_optimizer(self.module, opt_cfg, optimizer_steps)
        #: Steps the critic has trained, warm-up included (saved with it).
        self.steps = 0
        #: kind = head: the policy's last hidden states of this step's rows, [R_i, H].
        self._features: Rows = {}

    @property
    def warming_up(self) -> bool:
        """Whether this step trains the critic alone (``critic.warmup_steps``)."""
        return self.steps < self.cfg.warmup_steps

    @torch.no_grad()
    def values(self, trainer: PolicyBatching, trajs: list[Trajectory], rows: list[int]) -> Rows:
        """Each row's values ``[R_i]`` now (the step's "old" values); a head also keeps
        the policy's features of these rows for `update`."""
        self._features = {}
        out: Rows = {}
        for idx in trainer._plan([trajs[i] for i in rows]):
            batch = [rows[j] for j in idx]
            mb = trainer._collate(trajs, batch)
            lengths = [len(trajs[i].response_ids) for i in batch]
            if self.cfg.kind == "model":
                per_token = trainer._forward_logits(self.module, mb)[..., 0]
                for i, v in zip(batch, _split_rows(mb, per_token, lengths), strict=True):
                    out[i] = v.float()
                continue
            with hidden_states_as_logits(trainer.model):
                hidden = trainer._forward_logits(trainer.model, mb)
            for i, h in zip(batch, _split_rows(mb, hidden, lengths), strict=True):
                self._features[i] = h
                out[i] = self.module(h)[:, 0].float()
        return out

    def _values_with_grad(self, trainer: PolicyBatching, trajs, batch: list[int], mb) -> list:
        lengths = [len(trajs[i].response_ids) for i in batch]
        if self.cfg.kind == "head":
            return [self.module(self._features[i])[:, 0].float() for i in batch]
        per_token = trainer._forward_logits(self.module, mb)[..., 0]
        return [v.float() for v in _split_rows(mb, per_token, lengths)]

    def update(
        self,
        trainer: PolicyBatching,
        trajs: list[Trajectory],
        chunks: list[list[int]],
        old_values: Rows,
        returns: Rows,
    ) -> dict[str, tuple[float, float]]:
        """``ppo_epochs`` passes over ``chunks`` (the policy's mini-batches), one critic
        step each; stats map name -> (value, weight)."""
        self.module.train()
        acc: dict[str, float] = defaultdict(float)
        steps = 0
        for _epoch in range(trainer.cfg.ppo_epochs):
            for chunk in chunks:
                self._step(trainer, trajs, chunk, old_values, returns, acc)
                steps += 1
        self.steps += 1
        self._features = {}  # a head's cached features: this step's only
        n = max(acc.pop("tokens", 0.0), 1.0)
        return {
            "value_loss": (acc["loss"] / max(steps, 1), 1.0),
            "value_clip_frac": (acc["clip_tokens"] / n, n),
            "critic_grad_norm": (acc["grad_norm"] / max(steps, 1), 1.0),
            "critic_lr": (self.scheduler.get_last_lr()[0], 1.0),
        }

    def _step(self, trainer, trajs, chunk, old_values, returns, acc) -> None:
        """One critic optimizer step over the mini-batch ``chunk``."""
        mine = trainer._shard(trajs, chunk)
        total = float(sum(trajs[i].num_policy_tokens for i in chunk))
        self.optimizer.zero_grad(set_to_none=True)
        loss_sum = 0.0
        for idx in trainer._plan([trajs[i] for i in mine]):
            batch = [mine[j] for j in idx]
            mb = trainer._collate(trajs, batch) if self.cfg.kind == "model" else None
            values = _pad(self._values_with_grad(trainer, trajs, batch, mb))
            old, ret = (_pad([x[i] for i in batch]) for x in (old_values, returns))
            mask = loss_masks(trajs, batch)
            per_token, stats = value_loss(
                values,
                old.to(values.device),
                ret.to(values.device),
                mask.to(values.device),
                self.cfg.value_clip,
            )
            loss = aggregate_loss(
                per_token, mask.to(values.device), "token-mean", total_tokens=total
            )
            loss.backward()
            loss_sum += float(loss.detach())
            n = float(mask.sum())
            acc["clip_tokens"] += stats["value_clip_frac"] * n
            acc["tokens"] += n
        params = [p for p in self.module.parameters() if p.requires_grad]
        norm = float(torch.nn.utils.clip_grad_norm_(params, self.cfg.grad_clip))
        if norm == norm and norm != float("inf"):
            self.optimizer.step()
        self.scheduler.step()
        acc["loss"] += loss_sum
        acc["grad_norm"] += norm

    def state_dict(self) -> dict:
        return {
            "kind": self.cfg.kind,
            "module": {k: v.detach().clone() for k, v in self.module.state_dict().items()},
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "steps": self.steps,
        }

    def load_state_dict(self, state: dict | None) -> None:
        """Load a saved critic; ``None`` (a checkpoint written without one) keeps this
        fresh critic, with a warning."""
        if state is None:
            warnings.warn(
                "the checkpoint holds no critic (it was written by a run without "
                "algo.advantage = 'gae'): the critic starts fresh",
                stacklevel=2,
            )
            return
        if state["kind"] != self.cfg.kind:
            raise ValueError(
                f"the checkpoint's critic is a {state['kind']!r}, this run's critic.kind is "
                f"{self.cfg.kind!r}"
            )
        with torch.no_grad():
            self.module.load_state_dict(state["module"])
        self.optimizer.load_state_dict(copy.deepcopy(state["optimizer"]))
        self.scheduler.load_state_dict(state["scheduler"])
        self.steps = int(state["steps"])


def loss_masks(trajs: list[Trajectory], rows: list[int]) -> torch.Tensor:
    """The loss masks of ``trajs[i] for i in rows``, ``[len(rows), longest]`` float."""
    return _pad([torch.tensor(trajs[i].loss_mask, dtype=torch.float32) for i in rows])


def _pad(rows: list[torch.Tensor]) -> torch.Tensor:
    """Stack ``[R_i]`` rows into ``[B, max R_i]``, zero-padded on the right."""
    return torch.nn.utils.rnn.pad_sequence(rows, batch_first=True)


def token_rewards(traj: Trajectory, credit: str) -> list[float]:
    """The rewards GAE steps through: per response token (credit = outcome: the episode's
    reward on its last policy token) or per turn (credit = turn: each assistant turn's
    reward, `episode_turn_rewards`)."""
    if credit == "turn":
        return episode_turn_rewards(traj.turn_rewards, len(traj.turn_spans), traj.reward)
    out = [0.0] * len(traj.response_ids)
    last = max((j for j, m in enumerate(traj.loss_mask) if m), default=None)
    if last is not None:
        out[last] = float(traj.reward)
    return out


def gae_targets(
    algo: AlgoConfig, trajs: list[Trajectory], rows: list[int], old_values: Rows
) -> tuple[Rows, Rows, torch.Tensor]:
    """(advantages, returns, mask) of ``trajs[i] for i in rows``: per-row ``[R_i]``
    advantages and value targets, before whitening, and the ``[len(rows), R]`` loss
    mask. credit = outcome: token-level GAE with ``gae_gamma``; credit = turn:
    turn-level GAE with ``turn_discount``, each turn's advantage and return on its
    tokens (the state of a turn is its first token)."""
    mask = loss_masks(trajs, rows)
    values = _pad([old_values[i].detach().float().cpu() for i in rows])
    if algo.credit == "turn":
        return (*_turn_targets(algo, trajs, rows, values), mask)
    rewards = _pad([torch.tensor(token_rewards(trajs[i], "outcome")) for i in rows])
    adv, ret = gae(rewards, values, mask, algo.gae_gamma, algo.gae_lambda)
    lengths = [len(trajs[i].response_ids) for i in rows]
    return (
        {i: adv[k, :n] for k, (i, n) in enumerate(zip(rows, lengths, strict=True))},
        {i: ret[k, :n] for k, (i, n) in enumerate(zip(rows, lengths, strict=True))},
        mask,
    )


def _turn_targets(
    algo: AlgoConfig, trajs: list[Trajectory], rows: list[int], values: torch.Tensor
) -> tuple[Rows, Rows]:
    spans = [trajs[i].turn_spans or [(0, len(trajs[i].response_ids))] for i in rows]
    rewards = _pad([torch.tensor(token_rewards(trajs[i], "turn")) for i in rows])
    turn_values = _pad([values[k, [s for s, _ in sp]] for k, sp in enumerate(spans)])
    turn_mask = _pad([torch.ones(len(sp)) for sp in spans])
    adv, ret = turn_gae(rewards, turn_values, turn_mask, algo.turn_discount, algo.gae_lambda)
    advantages, returns = {}, {}
    for k, (i, sp) in enumerate(zip(rows, spans, strict=True)):
        n = len(trajs[i].response_ids)
        advantages[i] = torch.tensor(token_advantages(adv[k, : len(sp)].tolist(), sp, n))
        returns[i] = torch.tensor(token_advantages(ret[k, : len(sp)].tolist(), sp, n))
    return advantages, returns


def whiten(trainer: PolicyBatching, advantages: Rows, mask: torch.Tensor, rows: list[int]) -> Rows:
    """Advantages normalised to mean 0, std 1 over the step's policy tokens (moments
    summed over processes with the trainer's ``_reduce_sums``)."""
    adv = _pad([advantages[i] for i in rows])
    count, total, total_sq = masked_moments(adv, mask)
    sums = trainer._reduce_sums({"n": count, "s": total, "ss": total_sq})
    out = normalise_over_batch(adv, mask, (sums["n"], sums["s"], sums["ss"]))
    return {i: out[k, : advantages[i].shape[0]] for k, i in enumerate(rows)}


def critic_stats(old_values: Rows, returns: Rows, advantages: Rows, mask, rows) -> dict:
    """The step's value diagnostics (before the update): mean value, mean return, mean
    raw advantage and explained variance over the policy tokens."""
    v, r, a = (
        _pad([x[i].detach().float().cpu() for i in rows]) for x in (old_values, returns, advantages)
    )
    n = max(float(mask.sum()), 1.0)
    return {
        "value_mean": float((v * mask).sum()) / n,
        "return_mean": float((r * mask).sum()) / n,
        "advantage_raw_mean": float((a * mask).sum()) / n,
        "explained_variance": explained_variance(v, r, mask),
    }
