"""Pipeline parallelism: the decoder layers split into ``trainer.pp`` stages.

Each ``pp`` coordinate of the mesh (`temper.trainer.parallel.build_mesh`) holds
one `StageModel`: a contiguous slice of the decoder layers, plus the
embeddings on the first stage and the final norm and output layer on the
last. It is the HF model itself, pruned in place, so every parameter keeps
its name (``model.layers.5.mlp.up_proj.weight`` on whichever stage holds layer
5): DCP checkpoints written in one layout load in any other, and the weights
streamed to the engines land under their usual names.

Micro-batches run through ``torch.distributed.pipelining`` (`PipelineStage`
with static shapes, `Schedule1F1B` or `ScheduleGPipe`). Those stages need one
activation shape for every micro-batch of a step, so pipelined training is
packed (`temper.trainer.packing`): each micro-batch is one row, padded to the
step's longest (`pad_packed`, a segment that attends only to itself). A row's
packing layout (which keys each query sees, positions, the positions whose
logits count) is not an activation: every stage builds the same micro-batches
from the same trajectories and looks its layout up by the micro-batch index,
which the schedule hands each stage alongside the activations.

Tied embeddings (the built-in tiny model, Qwen2/3 small models) sit on two
stages: the first embeds with the matrix and the last projects with it (and
holds it under both names, as the whole model does). After the backward the two
copies' gradients are summed between the stages
(`temper.trainer.dist_worker.PipelinedPolicyTrainer._sync_tied`), so both
apply the update one process would; the gradient norm counts it once.

The last stage computes the loss of each micro-batch with the trainer's own
loss code (`PolicyTrainer._loss`) as the schedule's ``loss_fn``; the step's
metrics and trainer logprobs therefore come from the last stage, and are summed
over the stages' group like any other per-rank sum.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

from temper.algos import token_logprobs
from temper.errors import ConfigError
from temper.trainer.packing import (
    ATTENTION_NAME,
    PackedMicroBatch,
    attention_implementation,
    pad_packed,
)

SCHEDULES = {"1f1b": Schedule1F1B, "gpipe": ScheduleGPipe}


def stage_layers(num_layers: int, stages: int, stage: int) -> range:
    """The decoder layers of ``stage``: contiguous, the first ``num_layers % stages``
    stages one layer longer."""
    base, extra = divmod(num_layers, stages)
    start = stage * base + min(stage, extra)
    return range(start, start + base + (stage < extra))


def check_pp(model: torch.nn.Module, pp: int) -> None:
    """Refuse a ``pp`` the model cannot be split into (ConfigError)."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None or not hasattr(model, "lm_head"):
        raise ConfigError(
            f"trainer.pp = {pp}: {type(model).__name__} is not a decoder LM with model.layers "
            "and lm_head; pipeline parallelism supports Llama, Qwen2 and Qwen3-style decoders"
        )
    if pp > len(layers):
        raise ConfigError(f"trainer.pp = {pp} is more stages than the model's {len(layers)} layers")


def _tied(model: torch.nn.Module) -> bool:
    return model.lm_head.weight is model.model.embed_tokens.weight


class StageModel(torch.nn.Module):
    """One pipeline stage of a HF decoder LM; see the module docstring.

    ``forward(x, mb_index)``: ``x`` is the micro-batch's token ids ``[1, T]`` on the
    first stage and the hidden states ``[1, T, H]`` elsewhere. Non-last stages
    return hidden states; the last returns the flat response logits ``[N, V]`` of
    `temper.trainer.packing.packed_logits` (with ``emit_logprobs``: the targets'
    logprobs ``[N]``, for a forward-only pass).
    """

    def __init__(self, causal_lm: torch.nn.Module, stage: int, stages: int) -> None:
        super().__init__()
        check_pp(causal_lm, stages)
        inner, tied = causal_lm.model, _tied(causal_lm)
        self.is_first, self.is_last, self.tied = stage == 0, stage == stages - 1, tied
        keep = stage_layers(len(inner.layers), stages, stage)
        # Keyed by the original index, so parameter names do not change.
        inner.layers = torch.nn.ModuleDict({str(i): inner.layers[i] for i in keep})
        if not (self.is_first or (self.is_last and tied)):
            inner.embed_tokens = None
        if not self.is_last:
            inner.norm = None
        self.model = inner
        # Tied, the last stage holds the matrix under both names, as the whole model does,
        # so checkpoints written in any layout have both.
        self.lm_head = causal_lm.lm_head if self.is_last else None
        self.config = causal_lm.config
        #: The current step's micro-batches, looked up by index in `forward`.
        self.batches: list[PackedMicroBatch] = []
        self.emit_logprobs = False
        #: How a forward-only pass turns logits into logprobs (the trainer's, which
        #: knows whether the logits are a shard of the vocabulary).
        self.logprobs = token_logprobs

    def forward(self, x: torch.Tensor, mb_index: torch.Tensor) -> torch.Tensor:
        mb = self.batches[int(mb_index[0])]
        inner = self.model
        hidden = inner.embed_tokens(x) if self.is_first else x
        positions = mb.position_ids
        rotary = inner.rotary_emb(hidden, position_ids=positions)
        with attention_implementation(self, ATTENTION_NAME):
            for layer in inner.layers.values():
                hidden = layer(
                    hidden,
                    attention_mask=None,
                    position_ids=positions,
                    position_embeddings=rotary,
                    packed=mb.layout,
                )
        if not self.is_last:
            return hidden
        logits = self.lm_head(inner.norm(hidden[:, mb.keep]))
        logits = logits[0].index_select(0, mb.flat_index).float()
        return self.logprobs(logits, mb.targets) if self.emit_logprobs else logits


def tie_groups(mesh: Any) -> dist.ProcessGroup | None:
    """The group joining this rank with its peer (same dp_shard and tp coordinates)
    on the other end of the pipeline, for a tied embedding's gradient; None on a
    middle stage. Every rank creates every group (``new_group`` is collective)."""
    ranks = mesh.mesh  # [pp, dp_shard, tp] global ranks
    mine = None
    for d in range(ranks.shape[1]):
        for t in range(ranks.shape[2]):
            pair = [int(ranks[0, d, t]), int(ranks[-1, d, t])]
            group = dist.new_group(pair)
            if dist.get_rank() in pair:
                mine = group
    return mine


def run_pipeline(
    stage_model: StageModel,
    mbs: list[PackedMicroBatch],
    mesh: Any,
    schedule: str,
    pad_id: int,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None,
) -> list[torch.Tensor]:
    """Run ``mbs`` through the pipeline: forward and backward with ``loss_fn`` (called
    on the last stage with each micro-batch's logits and index), or forward only
    with None. Returns the last stage's per-micro-batch outputs ([] elsewhere)."""
    group = mesh["pp"].get_group()
    device = next(stage_model.parameters()).device
    width = torch.tensor([max(mb.input_ids.shape[1] for mb in mbs)], device=device)
    dist.all_reduce(width, op=dist.ReduceOp.MAX, group=group)
    width = int(width.item())
    mbs = [pad_packed(mb, width, pad_id).to(device) for mb in mbs]
    stage_model.batches = mbs
    stage_model.emit_logprobs = loss_fn is None
    # Static shapes: the hidden states between stages, which carry gradients back.
    hidden = torch.empty(1, width, stage_model.config.hidden_size, device=device)
    hidden.requires_grad_(loss_fn is not None)
    ids = torch.empty(1, width, dtype=torch.long, device=device)
    stage = PipelineStage(
        stage_model,
        mesh.get_local_rank("pp"),
        mesh["pp"].size(),
        device,
        input_args=ids if stage_model.is_first else hidden,
        output_args=hidden if not stage_model.is_last else torch.empty(1, device=device),
        group=group,
    )
    runner = SCHEDULES[schedule](stage, len(mbs), loss_fn=loss_fn, scale_grads=False)
    args = (torch.cat([mb.input_ids for mb in mbs]),) if stage_model.is_first else ()
    kwargs = {"mb_index": torch.arange(len(mbs), device=device)}
    try:
        if loss_fn is None:
            runner.eval(*args, **kwargs)
        else:
            target = torch.arange(len(mbs), device=device) if stage_model.is_last else None
            runner.step(*args, target=target, **kwargs)
        return list(stage.output_chunks) if stage_model.is_last else []
    finally:
        stage_model.batches = []
