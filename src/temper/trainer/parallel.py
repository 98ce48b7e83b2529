"""The sharded trainer's layout: one DeviceMesh (pp x dp_shard x tp) and the plans on it.

``trainer.world_size = N`` ranks form a 3-D mesh ``(pp, dp_shard, tp)`` with
``pp = trainer.pp``, ``tp = trainer.tp`` and ``dp_shard = N / (pp * tp)``
(`build_mesh`). A ``pp`` coordinate holds one pipeline stage, a slice of the
decoder layers (`temper.trainer.pipeline`); ranks that share a ``dp_shard``
coordinate hold the same rows of every batch; ``tp`` ranks split each layer
between them.

`parallelize` applies, in torchtitan's order, tensor parallelism to every
decoder layer (`tp_plan`: Megatron's column-wise q/k/v and gate/up projections,
row-wise o and down projections, so each attention head and each MLP column
lives on one rank and a layer costs one all-reduce forward and one backward),
then FSDP2 over ``dp_shard`` (each layer, then the root). Embeddings, norms and
the output layer stay replicated over ``tp``: for the models Temper supports the
vocabulary is small next to the layers, and a replicated output keeps the loss
code unchanged.

The plans use `torch.distributed.tensor.parallel` (``parallelize_module``,
``ColwiseParallel``, ``RowwiseParallel``) with local outputs, so the attention
code of the HF model sees plain tensors of its local heads; it reshapes with
``-1`` heads, which is what makes that work.

`clip_grad_norm` is the global-norm clip over parameters some of which are
DTensors (on the tp mesh, the dp mesh or both) and some plain tensors, which
``torch.nn.utils.clip_grad_norm_`` cannot mix.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    PrepareModuleInputOutput,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from temper.errors import ConfigError
from temper.trainer.expert_parallel import shard_experts
from temper.trainer.vocab_parallel import VocabShard, shard_vocab

#: Decoder-layer submodules by how they split: Llama, Qwen2 and Qwen3 name them alike.
COLWISE = (
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
)
ROWWISE = ("self_attn.o_proj", "mlp.down_proj")


def build_mesh(world_size: int, tp: int, device_type: str, pp: int = 1) -> DeviceMesh:
    """The ``(pp, dp_shard, tp)`` mesh over the default process group's ranks."""
    if world_size % (tp * pp):
        raise ConfigError(
            f"trainer.world_size = {world_size} is not a multiple of trainer.tp x trainer.pp "
            f"= {tp * pp}"
        )
    return init_device_mesh(
        device_type, (pp, world_size // (tp * pp), tp), mesh_dim_names=("pp", "dp_shard", "tp")
    )


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The decoder layers a model (or a pipeline stage of one) holds, in order."""
    layers = model.model.layers
    return list(layers.values() if isinstance(layers, torch.nn.ModuleDict) else layers)


def check_tp(config: object, tp: int) -> None:
    """Refuse a ``tp`` that does not divide the model's heads and MLP width (ConfigError)."""
    sizes = {
        "num_attention_heads": getattr(config, "num_attention_heads", None),
        "num_key_value_heads": getattr(config, "num_key_value_heads", None),
        "intermediate_size": getattr(config, "intermediate_size", None),
    }
    for name, value in sizes.items():
        if value is None:
            raise ConfigError(
                f"trainer.tp = {tp}: the model's config has no {name}; tensor parallelism "
                "supports Llama, Qwen2 and Qwen3-style decoders"
            )
        if value % tp:
            raise ConfigError(f"trainer.tp = {tp} does not divide the model's {name} = {value}")


def tp_plan(layer: torch.nn.Module, sequence_parallel: bool = False) -> dict[str, object]:
    """The tensor-parallel plan of one decoder layer (names relative to the layer)."""
    names = {name for name, _ in layer.named_modules()}
    missing = [n for n in (*COLWISE, *ROWWISE) if n not in names]
    if missing:
        raise ConfigError(
            f"trainer.tp > 1: a decoder layer of {type(layer).__name__} has no {missing[0]}; "
            "tensor parallelism supports Llama, Qwen2 and Qwen3-style decoders"
        )
    plan: dict[str, object] = {name: ColwiseParallel() for name in COLWISE}
    plan.update({name: RowwiseParallel() for name in ROWWISE})
    if sequence_parallel:
        plan.update(_sequence_parallel_plan(layer))
    return plan


def _sequence_parallel_plan(layer: torch.nn.Module) -> dict[str, object]:
    """Megatron's sequence parallelism inside one decoder layer: the residual stream
    and both norms hold 1/tp of the sequence (``Shard(1)``); each block's input is
    all-gathered to the whole sequence, and its row-wise output reduce-scattered back
    instead of all-reduced (`layer_boundary` splits and gathers at the stack's ends)."""
    norms = ("input_layernorm", "post_attention_layernorm")
    missing = [n for n in norms if not hasattr(layer, n)]
    if missing:
        raise ConfigError(
            f"trainer.sequence_parallel: a decoder layer of {type(layer).__name__} has no "
            f"{missing[0]}; it supports Llama, Qwen2 and Qwen3-style decoders"
        )
    plan: dict[str, object] = {name: SequenceParallel() for name in norms}
    plan["self_attn"] = PrepareModuleInput(
        input_kwarg_layouts={"hidden_states": Shard(1)},
        desired_input_kwarg_layouts={"hidden_states": Replicate()},
    )
    plan["mlp"] = PrepareModuleInput(
        input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)
    )
    for name in ROWWISE:
        plan[name] = RowwiseParallel(output_layouts=Shard(1), use_local_output=False)
    return plan


def layer_boundary(first: bool, last: bool) -> object | None:
    """With sequence parallelism, the style of a layer that starts (splits its plain
    input by sequence: no communication) or ends (gathers its output back to a plain
    tensor) its stack, so embeddings, the final norm and the output layer, and the
    activations between pipeline stages, are whole as without it."""
    split = {"input_layouts": (Replicate(),), "desired_input_layouts": (Shard(1),)}
    gather = {"output_layouts": (Shard(1),), "desired_output_layouts": (Replicate(),)}
    if first and last:
        return PrepareModuleInputOutput(**split, **gather, use_local_output=True)
    if first:
        return PrepareModuleInput(**split)
    if last:
        return PrepareModuleOutput(**gather, use_local_output=True)
    return None


def parallelize(
    model: torch.nn.Module,
    mesh: DeviceMesh,
    ep: int = 1,
    sequence_parallel: bool = False,
    loss_parallel: bool = False,
) -> VocabShard | None:
    """Tensor parallel over ``mesh["tp"]`` (with ``sequence_parallel``, norms and the
    residual stream split by sequence; with ``loss_parallel``, the output layer and
    embeddings by vocabulary, `temper.trainer.vocab_parallel`), experts over
    ``mesh["dp_shard"]`` when ``ep > 1`` (`temper.trainer.expert_parallel`), then
    FSDP2 over ``mesh["dp_shard"]`` for everything else, in place. Returns this rank's
    vocabulary shard with ``loss_parallel`` (None otherwise, or on a stage without
    the output layer).

    FSDP sums gradients rather than averaging them: each rank's loss is already
    divided by the global counts. Gloo has no pre-multiplied sum, hence the forced
    plain sum.
    """
    tp, dp = mesh["tp"], mesh["dp_shard"]
    if tp.size() > 1:
        check_tp(model.config, tp.size())
        layers = decoder_layers(model)
        for i, layer in enumerate(layers):
            parallelize_module(layer, tp, tp_plan(layer, sequence_parallel))
            boundary = layer_boundary(i == 0, i == len(layers) - 1)
            if sequence_parallel and boundary is not None:
                parallelize_module(layer, tp, boundary)
    vocab = shard_vocab(model, tp) if loss_parallel and tp.size() > 1 else None
    experts = shard_experts(model, dp) if ep > 1 else set()
    if dp.size() > 1:
        for layer in decoder_layers(model):
            fully_shard(layer, mesh=dp, ignored_params=experts)
        fully_shard(model, mesh=dp, ignored_params=experts)
        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.set_gradient_divide_factor(1.0)
                module.set_force_sum_reduction_for_comms(True)
    return vocab


def clip_grad_norm(
    params: list[torch.nn.Parameter],
    max_norm: float,
    counted: list[torch.nn.Parameter] | None = None,
    stages: dist.ProcessGroup | None = None,
) -> float:
    """Scale gradients so their global L2 norm is at most ``max_norm``; returns the norm
    before clipping (inf or NaN left unscaled). DTensor gradients contribute their full
    tensor's norm, each once, whatever their placements.

    Pipeline stages: ``stages`` is the group of this rank's peers on the other stages,
    whose squared norms are added in; ``counted`` (default: ``params``) are the
    parameters this stage counts (a tied embedding held by two stages counts once)."""
    grads = [p.grad for p in params if p.grad is not None]
    counted_ids = {id(p) for p in (params if counted is None else counted)}
    total_sq = torch.zeros((), dtype=torch.float64, device=grads[0].device if grads else None)
    for p in params:
        if p.grad is None:
            continue
        norm = torch.linalg.vector_norm(p.grad.detach(), dtype=torch.float64)
        if isinstance(norm, DTensor):
            norm = norm.full_tensor()  # a collective: every rank of the mesh runs it
        if id(p) in counted_ids:
            total_sq += norm**2
    if stages is not None:
        dist.all_reduce(total_sq, group=stages)
    total = math.sqrt(float(total_sq))
    if math.isfinite(total) and total > max_norm:
        coef = max_norm / (total + 1e-6)
        for g in grads:
            g.detach().mul_(coef)
    return total
