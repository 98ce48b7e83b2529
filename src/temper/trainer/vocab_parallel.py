"""Loss parallel: the output layer split by vocabulary over the tp ranks.

Without it every tp rank holds the whole ``[tokens, vocab]`` logits of each
micro-batch, in float32 for the loss: for a 150k vocabulary that is 600 KB a
token, often more than the layer activations. With ``trainer.loss_parallel``
the output layer is column-parallel over the vocabulary (`ColwiseParallel`,
local outputs), so each rank computes and keeps only its ``vocab / tp``
columns of the logits, and the token logprobs and entropies the loss needs are
reduced across ranks from per-rank partial sums (`VocabShard`):

    lse  = m + log sum_r sum_{v in r} exp(z_v - m),   m = max over all ranks
    logp = z_target - lse                            (z_target from the rank holding it)
    H    = lse - sum_r sum_{v in r} softmax(z)_v z_v

PyTorch's ``loss_parallel`` covers ``cross_entropy`` on a vocabulary-sharded
DTensor; Temper's loss needs per-token logprobs and entropies, hence these
few reductions, as autograd functions with their gradients written out
(``onehot - softmax`` and ``softmax * (mean logit - z)``): those need only the
rank's own columns and the sums already reduced, so the backward communicates
nothing. (Letting autograd differentiate through the all-reduces would be wrong
here: each rank's graph holds only its own columns' share of the sums.)

The input embedding is split the same way (row-wise over the vocabulary, so its
lookup is one all-reduce), and a tied output layer stays tied: both modules
hold the same vocabulary-sharded parameter.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module


def _all_reduce(x: torch.Tensor, group: dist.ProcessGroup, op=dist.ReduceOp.SUM) -> torch.Tensor:
    dist.all_reduce(x, op=op, group=group)
    return x


def _lse(logits: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """log-sum-exp over the whole vocabulary from this rank's columns (no autograd)."""
    peak = _all_reduce(logits.amax(dim=-1), group, dist.ReduceOp.MAX)
    total = _all_reduce(torch.exp(logits - peak.unsqueeze(-1)).sum(-1), group)
    return peak + torch.log(total)


class _LogProb(torch.autograd.Function):
    """``log softmax(z)[target]``; the gradient, ``onehot(target) - softmax(z)``, needs
    only this rank's columns and the reduced log-sum-exp (no backward communication:
    every rank gets the same upstream gradient, the loss being computed alike)."""

    @staticmethod
    def forward(ctx, logits, targets, shard):
        lse = _lse(logits, shard.group)
        local = targets - shard.start
        mine = ((local >= 0) & (local < shard.size)).to(logits.dtype)
        index = local.clamp(0, shard.size - 1).unsqueeze(-1)
        picked = _all_reduce(logits.gather(-1, index).squeeze(-1) * mine, shard.group)
        ctx.save_for_backward(logits, lse, index, mine)
        return picked - lse

    @staticmethod
    def backward(ctx, grad):
        logits, lse, index, mine = ctx.saved_tensors
        out = -torch.exp(logits - lse.unsqueeze(-1))
        out.scatter_add_(-1, index, mine.unsqueeze(-1))
        return out * grad.unsqueeze(-1), None, None


class _Entropy(torch.autograd.Function):
    """``H = lse - sum softmax(z) z``; its gradient ``softmax(z) (sum softmax(z) z - z)``
    is local given the two reduced sums."""

    @staticmethod
    def forward(ctx, logits, shard):
        lse = _lse(logits, shard.group)
        probs = torch.exp(logits - lse.unsqueeze(-1))
        mean_logit = _all_reduce((probs * logits).sum(-1), shard.group)
        ctx.save_for_backward(logits, lse, mean_logit)
        return lse - mean_logit

    @staticmethod
    def backward(ctx, grad):
        logits, lse, mean_logit = ctx.saved_tensors
        probs = torch.exp(logits - lse.unsqueeze(-1))
        return probs * (mean_logit.unsqueeze(-1) - logits) * grad.unsqueeze(-1), None


@dataclass(frozen=True)
class VocabShard:
    """This rank's columns ``[start, start + size)`` of the vocabulary, and the tp group."""

    group: dist.ProcessGroup
    start: int
    size: int

    def logprobs(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Log-probability of each target ``[...]`` from this rank's logits ``[..., size]``."""
        return _LogProb.apply(logits, targets, self)

    def entropy(self, logits: torch.Tensor) -> torch.Tensor:
        """Entropy of each position's next-token distribution ``[...]``."""
        return _Entropy.apply(logits, self)


def shard_vocab(model: torch.nn.Module, tp: DeviceMesh) -> VocabShard | None:
    """Split ``model``'s output layer (column-wise) and input embedding (row-wise) by
    vocabulary over ``tp``, keeping a tie; returns this rank's shard (None when the
    model, a pipeline stage, has no output layer)."""
    head = getattr(model, "lm_head", None)
    embed = getattr(model.model, "embed_tokens", None)
    tied = head is not None and embed is not None and head.weight is embed.weight
    if head is not None:
        parallelize_module(head, tp, ColwiseParallel())
    if embed is not None:
        parallelize_module(embed, tp, RowwiseParallel(input_layouts=Replicate()))
        if tied:  # one parameter again, as before: both modules shard it by vocabulary rows
            embed.weight = head.weight
    if head is None:
        return None
    weight = head.weight
    if not isinstance(weight, DTensor) or weight.placements != (Shard(0),):
        raise RuntimeError(f"the output layer is not sharded by vocabulary: {weight.placements}")
    sizes = [0] * tp.size()
    dist.all_gather_object(sizes, weight.to_local().shape[0], group=tp.get_group())
    rank = tp.get_local_rank()
    return VocabShard(tp.get_group(), sum(sizes[:rank]), sizes[rank])
