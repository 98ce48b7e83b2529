"""The `[trainer]` config section: optimizer, batching, device and precision, and the
sharded trainer's layout (world size, tensor parallelism, rendezvous; docs/training.md,
docs/scaling.md)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class TrainerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    mode: Literal["rl", "sft", "rft", "dpo"] = Field(
        "rl",
        description="rl: policy-gradient steps on scored groups (`algo`). sft: supervised "
        "steps on the `sft` conversations (loss on assistant tokens). rft: rejection-sampling "
        "fine-tuning, each step a round: generate, keep by reward (`rft`), supervised steps "
        "(docs/self_improvement.md). dpo: Direct Preference Optimization on chosen/rejected "
        "pairs against the starting policy (`dpo`; docs/algorithms.md).",
    )
    lr: float = Field(1e-4, gt=0, le=1, description="Peak learning rate.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    betas: tuple[float, float] = Field((0.9, 0.99), description="AdamW betas.")
    warmup_steps: int = Field(5, ge=0, description="Linear warmup steps.")
    schedule: Literal["constant", "cosine", "linear"] = Field(
        "constant", description="Learning-rate schedule after warmup."
    )
    grad_clip: float = Field(1.0, gt=0, description="Max global grad norm.")
    micro_batch_tokens: int = Field(
        8192,
        ge=16,
        description="Padded-token budget of one micro-batch: distinct prompts x longest prompt "
        "+ responses x longest response.",
    )
    micro_batch_overhead_tokens: int = Field(
        64,
        ge=0,
        description="What one more micro-batch costs, in padded tokens: the planner cuts "
        "length-sorted rows into micro-batches trading padding against this.",
    )
    packing: bool = Field(
        False,
        description="Pack trajectories into padding-free rows of micro_batch_tokens tokens "
        "(each prompt once per row, attention only within a sequence and its prompt); "
        "vision-language models train unpacked (docs/training.md).",
    )
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="Where the trainer runs (world_size 1): auto = CUDA when present."
    )
    precision: Literal["auto", "fp32", "bf16"] = Field(
        "auto",
        description="bf16 uses autocast; auto = bf16 on CUDA, fp32 on CPU (weights stay fp32).",
    )
    ppo_epochs: int = Field(
        1, ge=1, description="Passes over each batch (sft/rft/dpo: over each step's samples)."
    )
    mini_batches: int = Field(1, ge=1, description="Optimizer steps per pass.")
    freeze_vision_tower: bool = Field(
        True,
        description="Vision-language models: keep the vision encoder's weights fixed (the "
        "projector and language model train). False trains the encoder too.",
    )
    world_size: int = Field(
        1,
        ge=1,
        le=1024,
        description="Trainer processes. 1 trains in the run's process; N > 1 spawns N "
        "FSDP2 ranks, each training on a shard of every mini-batch (docs/scaling.md).",
    )
    tp: int = Field(
        1,
        ge=1,
        description="Tensor-parallel degree within world_size (Megatron-style column/row "
        "splits of every decoder layer); world_size / tp ranks shard data and parameters "
        "with FSDP2 (docs/scaling.md).",
    )
    sequence_parallel: bool = Field(
        False,
        description="With tp > 1: split the norms and the residual stream between layers by "
        "sequence over the tp ranks (Megatron's sequence parallelism: 1/tp of those "
        "activations per rank; reduce-scatter and all-gather instead of all-reduce).",
    )
    loss_parallel: bool = Field(
        False,
        description="With tp > 1: split the output layer and the input embeddings by "
        "vocabulary over the tp ranks, so each keeps 1/tp of every micro-batch's logits; "
        "the logprobs and entropies are reduced across them (docs/scaling.md).",
    )
    pp: int = Field(
        1,
        ge=1,
        description="Pipeline-parallel degree within world_size: the decoder layers split "
        "into pp stages, micro-batches flowing through them on pp_schedule; needs packing "
        "(one activation shape per micro-batch). world_size / (pp x tp) ranks shard data "
        "and parameters with FSDP2 (docs/scaling.md).",
    )
    pp_schedule: Literal["1f1b", "gpipe"] = Field(
        "1f1b",
        description="pp > 1: the pipeline schedule, torch.distributed.pipelining's "
        "Schedule1F1B (a stage holds at most pp micro-batches' activations; at least pp "
        "micro-batches run) or ScheduleGPipe (all forwards, then all backwards).",
    )
    ep: int = Field(
        1,
        ge=1,
        description="Expert-parallel degree for MoE models: each rank holds 1/ep of every "
        "MoE layer's experts and tokens are dispatched to them (all-to-all); needs tp = 1 and "
        "ep = world_size (the FSDP2 ranks) so far.",
    )
    launcher: Literal["spawn", "ray"] = Field(
        "spawn",
        description="How world_size > 1 ranks start: spawn = processes on this host; ray = "
        "Ray actors placed on the run's Ray cluster (needs orchestrator.backend = 'ray' or "
        "a connected Ray; docs/scaling.md).",
    )
    ray_num_cpus: float = Field(1.0, gt=0, description="launcher=ray: Ray CPUs per rank.")
    ray_num_gpus: float = Field(0.0, ge=0, description="launcher=ray: Ray GPUs per rank.")
    ray_placement: Literal["pack", "spread"] = Field(
        "pack", description="launcher=ray: placement-group strategy of the ranks' bundles."
    )
    master_addr: str | None = Field(
        None,
        description="Rendezvous host of the trainer ranks: spawned ranks default to "
        "127.0.0.1; under torchrun or mpirun, default MASTER_ADDR (docs/scaling.md).",
    )
    master_port: int | None = Field(
        None,
        ge=1,
        le=65535,
        description="Rendezvous port: spawned ranks default to a store the run's "
        "process serves on a port the kernel picks; under a launcher, default MASTER_PORT.",
    )
    backend: Literal["gloo", "nccl"] | None = Field(
        None,
        description="torch.distributed backend for world_size > 1; default gloo on CPU, "
        "nccl when CUDA is available.",
    )
    weight_sync_bucket_mb: float = Field(
        64.0,
        ge=0,
        description="With world_size > 1: after each step the ranks stream the full weights "
        "into the run's CPU copy in buckets of this many MiB (rank 0's extra memory); 0 = "
        "gather the whole state dict on rank 0 and send it through a pipe.",
    )
    worker_timeout_s: float = Field(
        1800.0,
        gt=0,
        description="With world_size > 1: the longest one trainer command (a step, a "
        "checkpoint) may take before the run stops with an error.",
    )

    @model_validator(mode="after")
    def _tp_divides_world_size(self) -> TrainerConfig:
        if self.world_size % (self.tp * self.pp):
            raise ValueError(
                f"trainer.world_size = {self.world_size} is not a multiple of trainer.tp x "
                f"trainer.pp = {self.tp * self.pp} (world_size counts every rank: "
                "pp x dp_shard x tp)"
            )
        for flag, on in (("sequence_parallel", self.sequence_parallel),
                         ("loss_parallel", self.loss_parallel)):  # fmt: skip
            if on and self.tp == 1:
                raise ValueError(f"trainer.{flag} = true needs trainer.tp > 1")
        if self.pp > 1 and not self.packing:
            raise ValueError(
                f"trainer.pp = {self.pp} trains packed rows: set trainer.packing = true "
                "(every micro-batch must have one activation shape for the pipeline stages)"
            )
        if self.pp > 1 and (self.ep > 1 or self.launcher != "spawn"):
            raise ValueError(
                f"trainer.pp = {self.pp} runs with trainer.ep = 1 and trainer.launcher = "
                f"'spawn' so far; got ep = {self.ep}, launcher = '{self.launcher}'"
            )
        if self.ep > 1 and (self.tp > 1 or self.ep != self.world_size):
            raise ValueError(
                f"trainer.ep = {self.ep} needs trainer.tp = 1 and trainer.world_size = ep "
                f"(experts are sharded over the FSDP2 ranks); got tp = {self.tp}, "
                f"world_size = {self.world_size}"
            )
        return self
