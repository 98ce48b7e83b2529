"""Expert parallelism: each rank holds 1/ep of every MoE layer's experts; tokens travel.

For transformers' fused-experts MoE layers (an ``experts`` module with 3-D
``gate_up_proj [E, 2I, H]`` and ``down_proj [E, H, I]``, routed top-k by the
layer's own router: Qwen3-MoE, Qwen2-MoE and others in transformers 5),
`shard_experts` turns both tensors into DTensors sharded by expert over the
``ep`` ranks (``Shard(0)``), so DCP checkpoints and the weight sync see whole
tensors, and replaces the module's forward with `_ep_forward`:

1. each (token, choice) pair is sorted by expert, and the pairs whose expert
   lives on rank r go to rank r (``all_to_all_single``; the counts first);
2. each rank runs its local experts on what it received;
3. the outputs go back the same way (the autograd all-to-all, so gradients
   return along the same path) and are summed per token with the router's
   weights, as the unsharded layer does.

Nothing is dropped (no capacity limit): every routed pair is computed. The
``ep`` ranks are the ``dp_shard`` ranks (they train different rows); the
router and every other parameter are FSDP2-sharded as usual, and the expert
tensors are left out of FSDP (``ignored_params``): each rank's expert
gradients are already complete, summed over every rank's tokens by the
backward all-to-all.

`moe_load` reads the routers' choices during a forward (a hook on each
router): tokens per expert, for the load-balance metrics.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Shard, distribute_tensor

from temper.errors import ConfigError


def expert_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The fused-experts modules of ``model`` (empty for a dense model)."""
    return [
        m
        for m in model.modules()
        if hasattr(m, "num_experts")
        and isinstance(getattr(m, "gate_up_proj", None), torch.nn.Parameter)
        and isinstance(getattr(m, "down_proj", None), torch.nn.Parameter)
        and m.gate_up_proj.dim() == 3
    ]


def check_ep(model: torch.nn.Module, ep: int) -> list[torch.nn.Module]:
    """``model``'s experts modules, or a ConfigError if ``ep`` cannot shard them."""
    modules = expert_modules(model)
    if not modules:
        raise ConfigError(
            f"trainer.ep = {ep}: {type(model).__name__} has no fused-experts MoE layers "
            "(gate_up_proj / down_proj per expert); expert parallelism needs an MoE model"
        )
    for m in modules:
        if m.num_experts % ep:
            raise ConfigError(f"trainer.ep = {ep} does not divide the {m.num_experts} experts")
    return modules


def shard_experts(model: torch.nn.Module, mesh: DeviceMesh) -> set[torch.nn.Parameter]:
    """Shard every MoE layer's experts over ``mesh`` (1-D) in place; returns the new
    expert parameters (to keep out of FSDP)."""
    params: set[torch.nn.Parameter] = set()
    for m in check_ep(model, mesh.size()):
        for name in ("gate_up_proj", "down_proj"):
            sharded = torch.nn.Parameter(distribute_tensor(getattr(m, name).data, mesh, [Shard(0)]))
            setattr(m, name, sharded)
            params.add(sharded)
        m._ep_group = mesh.get_group()
        m.forward = types.MethodType(_ep_forward, m)
    return params


def _ep_forward(
    self: torch.nn.Module,
    hidden: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
) -> torch.Tensor:
    """The experts of one MoE layer over ``hidden [T, H]`` with the router's top-k
    choices ``[T, K]``: dispatch, local experts, combine (see the module doc)."""
    group = self._ep_group
    ep, rank = dist.get_world_size(group), dist.get_rank(group)
    per_rank = self.num_experts // ep
    k = top_k_index.shape[1]
    flat = top_k_index.reshape(-1)
    order = torch.argsort(flat, stable=True)
    token = order // k
    expert = flat[order]
    send = torch.bincount(expert // per_rank, minlength=ep)
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    send_sizes, recv_sizes = send.tolist(), recv.tolist()
    x = funcol.all_to_all_single_autograd(hidden[token], recv_sizes, send_sizes, group)
    got = torch.empty(sum(recv_sizes), dtype=expert.dtype, device=expert.device)
    dist.all_to_all_single(got, expert, recv_sizes, send_sizes, group=group)
    gate_up, down = self.gate_up_proj.to_local(), self.down_proj.to_local()
    y = x.new_zeros(x.shape)
    for j in range(per_rank):
        rows = (got == rank * per_rank + j).nonzero().squeeze(-1)
        if rows.numel():
            gate, up = F.linear(x[rows], gate_up[j]).chunk(2, dim=-1)
            y = y.index_add(0, rows, F.linear(self.act_fn(gate) * up, down[j]))
    back = funcol.all_to_all_single_autograd(y, send_sizes, recv_sizes, group)
    weighted = back * top_k_weights.reshape(-1)[order, None]
    out = hidden.new_zeros(hidden.shape).index_add(0, token, weighted.to(hidden.dtype))
    # Every local expert gets a gradient, zero when no token reached it, as in the
    # unsharded layer (whose fused tensor always has one): AdamW then steps alike.
    return out + 0.0 * (gate_up.sum() + down.sum())


@contextmanager
def moe_load(model: torch.nn.Module) -> Iterator[list[torch.Tensor]]:
    """Within this block, every router call of ``model`` appends its tokens per expert
    (``[E]``, counted over all k choices) to the yielded list."""
    counts: list[torch.Tensor] = []
    handles = []
    for block in model.modules():  # an MoE block holds its experts and its router
        experts, router = getattr(block, "experts", None), getattr(block, "gate", None)
        if router is None or not isinstance(experts, torch.nn.Module):
            continue
        if not isinstance(getattr(experts, "gate_up_proj", None), torch.nn.Parameter):
            continue
        n = experts.num_experts

        def hook(_mod, _args, out, n=n):
            counts.append(torch.bincount(out[-1].reshape(-1).detach().cpu(), minlength=n))

        handles.append(router.register_forward_hook(hook))
    try:
        yield counts
    finally:
        for h in handles:
            h.remove()


def moe_metrics(
    counts: list[torch.Tensor], layers: int, reduce: Callable[[dict], dict]
) -> dict[str, float]:
    """Load-balance metrics from `moe_load`'s counts (router calls cycle through the
    ``layers`` MoE layers in order), summed over ranks by ``reduce``:
    ``moe_load_max_over_mean``, the largest ratio of an expert's tokens to its layer's
    mean (1 = perfectly even), and ``moe_dropped_tokens``, 0 by construction (the
    dispatch has no capacity limit)."""
    if not counts or not layers:
        return {}
    totals = [torch.zeros_like(counts[0]) for _ in range(layers)]
    for i, c in enumerate(counts):
        totals[i % layers] += c
    flat = {f"moe_l{i}_e{e}": float(n) for i, t in enumerate(totals) for e, n in enumerate(t)}
    summed = reduce(flat)
    worst = 1.0
    for i, t in enumerate(totals):
        per_expert = [summed[f"moe_l{i}_e{e}"] for e in range(t.numel())]
        mean = sum(per_expert) / len(per_expert)
        if mean > 0:
            worst = max(worst, max(per_expert) / mean)
    return {"moe_load_max_over_mean": worst, "moe_dropped_tokens": 0.0}
