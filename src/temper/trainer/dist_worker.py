"""One rank of the sharded trainer: `PolicyTrainer`'s update over an FSDP2 model.

`run_worker` is the body of each process that
`temper.trainer.distributed.DistributedTrainer` spawns. It joins the process
group, loads the model, lays it out on the ``(dp_shard, tp)`` mesh
(`temper.trainer.parallel`: tensor parallel over ``tp`` when ``trainer.tp > 1``,
then ``fully_shard`` over ``dp_shard``, so each rank keeps 1/dp of every
parameter, gradient and AdamW moment), and serves commands from the parent over
a pipe: a training step, a DCP save or load, the scheduler state.

`ShardedPolicyTrainer` is `PolicyTrainer` with its data-parallel seams filled
in; the loss code is the same. Each ``dp_shard`` coordinate trains on a
contiguous slice of every mini-batch (its ``tp`` ranks on the same slice), but
normalises its loss by the whole mini-batch's counts, and FSDP sums (not
averages) the gradients, so the update equals the one-process update
up to float rounding. FSDP's collectives need every rank to run the same
forwards and backwards, so ranks with fewer micro-batches run empty ones
(zero loss mask) and every micro-batch runs the two-call forward.

With ``[lora]`` (``spec.lora``) each rank injects the same peft adapters before
FSDP2 shards the model; only they train, and what a rank hands back after a step,
and what its DCP shards hold, is the adapters alone (`_adapter_weights`).

It does not talk to the engine or write the HF checkpoint: the parent does.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import logging
import math
import os
import traceback
import warnings
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    set_state_dict,
)
from torch.distributed.tensor import DTensor

from temper.config.algo import AlgoConfig
from temper.config.distill import DistillConfig
from temper.config.dpo import DPOConfig
from temper.config.lora import LoraConfig
from temper.config.trainer import TrainerConfig
from temper.records import Trajectory
from temper.trainer.batching import MicroBatch, collate
from temper.trainer.checkpoint import dcp_state
from temper.trainer.packing import PackedMicroBatch, collate_packed, shard_by_tokens
from temper.trainer.parallel import build_mesh, clip_grad_norm, parallelize
from temper.trainer.pipeline import StageModel, run_pipeline, tie_groups
from temper.trainer.policy_trainer import PolicyTrainer
from temper.trainer.preference import ResponsePair, plan_pairs
from temper.trainer.weight_stream import stream_weights

if TYPE_CHECKING:  # imports peft: only a run with [lora] loads it
    from temper.trainer.lora import LoraAdapter

FULL_CPU = StateDictOptions(full_state_dict=True, cpu_offload=True)


@dataclass
class WorkerSpec:
    """Everything a rank needs to build its trainer (pickled to the spawned process)."""

    model_path: str
    ref_path: str | None
    cfg: TrainerConfig
    algo: AlgoConfig
    total_steps: int
    pad_id: int
    world_size: int
    backend: str
    init_method: str
    timeout_s: float
    parent_pid: int
    #: Bytes per bucket when streaming weights out (`weight_stream`); 0: one full gather.
    sync_bucket_bytes: int = 0
    #: ``algo.advantage = "distill"``: its settings, and the teacher each rank loads whole
    #: (None for a served teacher, whose scores come with the trajectories).
    distill: DistillConfig | None = None
    teacher_path: str | None = None
    #: ``[lora]``: every rank trains these peft adapters over the frozen base, starting
    #: from the parent's (random) initial adapters, so that all ranks hold the same ones.
    lora: LoraConfig | None = None
    lora_init: dict[str, torch.Tensor] | None = None
    #: ``trainer.mode = "dpo"``: its loss settings (`PreferenceTraining`).
    dpo: DPOConfig | None = None


class ShardedPolicyTrainer(PolicyTrainer):
    """`PolicyTrainer` on one rank of an FSDP2 model; see the module docstring."""

    def __init__(
        self,
        model: torch.nn.Module,
        spec: WorkerSpec,
        rank: int,
        device: torch.device,
        ref_model: torch.nn.Module | None = None,
        teacher: torch.nn.Module | None = None,
        adapter: LoraAdapter | None = None,
    ) -> None:
        self.rank, self.world_size, self.device = rank, spec.world_size, device
        self.sync_bucket_bytes = spec.sync_bucket_bytes
        #: Rank 0, streaming: the run's CPU copy of the weights, written in place.
        self.weight_sink: dict[str, torch.Tensor] | None = None
        self.mesh = build_mesh(spec.world_size, spec.cfg.tp, device.type, spec.cfg.pp)
        # Rows are split over dp_shard; the tp ranks (and pipeline stages) of one dp_shard
        # coordinate share them.
        self.dp_rank = self.mesh.get_local_rank("dp_shard")
        self.dp_size = self.mesh["dp_shard"].size()
        #: Metric sums add up over these groups, in order (`_reduce_sums`).
        self._sum_groups = [self.mesh["dp_shard"].get_group()]
        #: Whether this rank writes its weights into the run's copy (`_full_weights`):
        #: rank 0, and with pipeline stages the first rank of each.
        self.writes_weights = self.dp_rank == 0 and self.mesh.get_local_rank("tp") == 0
        #: Fewest micro-batches per mini-batch (a 1F1B pipeline needs one per stage).
        self.min_micro_batches = 1
        model = self._stage(model, spec.cfg)
        model.to(device)
        # Before the optimizer: AdamW holds shards. With trainer.loss_parallel, `vocab` is
        # this rank's columns of the vocabulary (its logits are those columns only).
        self.vocab = parallelize(
            model, self.mesh, spec.cfg.ep, spec.cfg.sequence_parallel, spec.cfg.loss_parallel
        )
        for frozen in (ref_model, teacher):  # whole on every rank, as the parent loaded them
            if frozen is not None:
                frozen.to(device)
        super().__init__(
            model, spec.cfg, spec.algo, spec.total_steps, spec.pad_id, ref_model=ref_model,
            teacher=teacher, distill=spec.distill, adapter=adapter, dpo=spec.dpo,
        )  # fmt: skip

    def _stage(self, model: torch.nn.Module, cfg: TrainerConfig) -> torch.nn.Module:
        """The part of ``model`` this rank holds: all of it (pipeline stages override)."""
        return model

    def _token_logprobs(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        if self.vocab is not None:
            return self.vocab.logprobs(logits, targets)
        return super()._token_logprobs(logits, targets)

    def _entropy(self, logits: torch.Tensor) -> torch.Tensor:
        if self.vocab is not None:
            return self.vocab.entropy(logits)
        return super()._entropy(logits)

    def _shard(self, trajs: list[Trajectory], chunk: list[int]) -> list[int]:
        """This rank's rows of the mini-batch; a group's shared prompt stays on one rank.

        Packed: whole groups spread by tokens (`packing.shard_by_tokens`, the same
        deterministic plan on every rank). Otherwise a contiguous slice of rows.
        """
        if self.cfg.packing:
            return shard_by_tokens(trajs, chunk, self.dp_size)[self.dp_rank]
        n, r, w = len(chunk), self.dp_rank, self.dp_size
        return chunk[r * n // w : (r + 1) * n // w]

    def _plan(self, trajs: list[Trajectory]) -> list[list[int]]:
        """The local plan, padded with empty micro-batches to the longest plan of any rank."""
        plan = super()._plan(trajs) if trajs else []
        count = torch.tensor([max(len(plan), self.min_micro_batches)], device=self.device)
        dist.all_reduce(count, op=dist.ReduceOp.MAX)
        return plan + [[] for _ in range(int(count.item()) - len(plan))]

    def _collate(self, trajs: list[Trajectory], rows: list[int]) -> MicroBatch | PackedMicroBatch:
        if self.cfg.packing:  # one model call per micro-batch, empty or not
            if not rows:
                trajs, rows = [self._filler()], [0]
            return collate_packed(trajs, rows, self.pad_id).to(self.device)
        if rows:
            mb = collate(trajs, rows, self.pad_id)
        else:  # an empty micro-batch: one masked-out row, so the collectives still line up
            mb = collate([self._filler()], [0], self.pad_id)
        return _widen_responses(mb, 2).to(self.device)

    def _pair_plan(self, batch: list[ResponsePair], packed: bool) -> list[list[int]]:
        """DPO: this rank's contiguous slice of the mini-batch's pairs, planned, padded
        with empty micro-batches to the longest plan of any rank (`_pair_backward`)."""
        n, r, w = len(batch), self.dp_rank, self.dp_size
        mine = list(range(r * n // w, (r + 1) * n // w))
        plan = plan_pairs([batch[i] for i in mine], self.cfg.micro_batch_tokens, packed)
        plan = [[mine[j] for j in group] for group in plan]
        count = torch.tensor([len(plan)], device=self.device)
        dist.all_reduce(count, op=dist.ReduceOp.MAX)
        return plan + [[] for _ in range(int(count.item()) - len(plan))]

    def _pair_backward(
        self,
        trajs: list[Trajectory],
        group: list[int],
        pairs: list[ResponsePair],
        total_pairs: int,
        acc: dict[str, float],
    ) -> None:
        if group:
            super()._pair_backward(trajs, group, pairs, total_pairs, acc)
            return
        # An empty micro-batch: a masked-out row through the same forward and backward,
        # so that FSDP's collectives line up with the other ranks'.
        mb = self._collate(trajs, [])
        (self._forward_logits(self.model, mb).sum() * 0.0).backward()

    def _filler(self) -> Trajectory:
        """A row that trains nothing (loss mask 0), for a rank with no rows left."""
        return Trajectory(
            task_id="",
            group_id=-1,
            prompt_ids=[self.pad_id],
            response_ids=[self.pad_id] * 2,
            loss_mask=[0, 0],
            behaviour_logprobs=[0.0, 0.0],
            versions=[0, 0],
            finish_reason="",
        )

    def _reduce_sums(self, acc: dict[str, float]) -> dict[str, float]:
        # A rank that ran only empty micro-batches may lack keys (stats logged only for
        # real tokens): agree on the union, a missing sum counting 0 and a missing max -inf.
        # Summed over dp_shard (the tp ranks of one coordinate hold the same rows), then
        # over the pipeline stages (only the last computes the loss and its stats).
        for group in self._sum_groups:
            gathered: list[Any] = [None] * dist.get_world_size(group)
            dist.all_gather_object(gathered, sorted(acc), group=group)
            keys = sorted(set().union(*gathered))
            out: dict[str, float] = {}
            for op, names, missing in (
                (dist.ReduceOp.SUM, [k for k in keys if not k.endswith("_max")], 0.0),
                (dist.ReduceOp.MAX, [k for k in keys if k.endswith("_max")], -math.inf),
            ):
                values = [acc.get(k, missing) for k in names]
                tensor = torch.tensor(values, dtype=torch.float64, device=self.device)
                dist.all_reduce(tensor, op=op, group=group)
                out.update(zip(names, tensor.tolist(), strict=True))
            acc = out
        return acc

    def _clip_grads(self) -> float:
        if self.mesh["tp"].size() > 1 or self.cfg.ep > 1:  # DTensors of mixed meshes/placements
            return clip_grad_norm(list(self.model.parameters()), self.cfg.grad_clip)
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip)
        if isinstance(norm, DTensor):
            norm = norm.full_tensor()
        return float(norm)


class PipelinedPolicyTrainer(ShardedPolicyTrainer):
    """`ShardedPolicyTrainer` on one pipeline stage (`temper.trainer.pipeline`): its
    micro-batches run through the pipeline schedule rather than one by one."""

    def _stage(self, model: torch.nn.Module, cfg: TrainerConfig) -> torch.nn.Module:
        pp = self.mesh["pp"].size()
        stage = StageModel(model, self.mesh.get_local_rank("pp"), pp)
        self._sum_groups.append(self.mesh["pp"].get_group())
        self.min_micro_batches = pp if cfg.pp_schedule == "1f1b" else 1
        #: The group of a tied embedding's two copies (first and last stage), if any.
        self._tie_group = tie_groups(self.mesh) if stage.tied else None
        stage.logprobs = self._token_logprobs
        return stage

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
        row_sets = [[mine[j] for j in idx] for idx in self._plan([trajs[i] for i in mine])]
        mbs = [self._collate(trajs, rows) for rows in row_sets]

        def loss_fn(logits: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
            k = int(index[0])
            return self._loss(mbs[k], logits, trajs, row_sets[k], old, ref, totals, acc, token_adv)

        run_pipeline(self.model, mbs, self.mesh, self.cfg.pp_schedule, self.pad_id, loss_fn)
        self._sync_tied()

    @torch.no_grad()
    def _logprobs_no_grad(
        self,
        model: torch.nn.Module,
        trajs: list[Trajectory],
        rows: list[int] | None = None,
        temperature: float = 1.0,
    ) -> dict[int, torch.Tensor]:
        if model is not self.model:  # the reference model, whole on every rank
            return super()._logprobs_no_grad(model, trajs, rows, temperature)
        rows = list(range(len(trajs))) if rows is None else rows
        row_sets = [[rows[j] for j in idx] for idx in self._plan([trajs[i] for i in rows])]
        mbs = [self._collate(trajs, r) for r in row_sets]
        outs = run_pipeline(self.model, mbs, self.mesh, self.cfg.pp_schedule, self.pad_id, None)
        result: dict[int, torch.Tensor] = {}
        for mb, batch_rows, out in zip(mbs, row_sets, outs, strict=False):
            per_row = mb.to_rows(out)
            for k, i in enumerate(batch_rows):
                result[i] = per_row[k]
        return result

    def _sync_tied(self) -> None:
        """Sum a tied embedding's gradient over its first- and last-stage copies."""
        if self._tie_group is None:
            return
        weight = self.model.model.embed_tokens.weight
        grad = weight.grad
        if grad is None:
            return
        if isinstance(grad, DTensor) and grad.placements != weight.placements:
            # A vocabulary-sharded embedding's lookup leaves a replicated gradient; the
            # output layer's is sharded like the weight. Match them, shard for shard.
            grad = weight.grad = grad.redistribute(placements=weight.placements)
        dist.all_reduce(
            grad.to_local() if isinstance(grad, DTensor) else grad, group=self._tie_group
        )

    def _clip_grads(self) -> float:
        params = list(self.model.parameters())
        counted = params
        if self.model.tied and self.model.is_last and not self.model.is_first:
            counted = [p for p in params if p is not self.model.model.embed_tokens.weight]
        return clip_grad_norm(params, self.cfg.grad_clip, counted, self.mesh["pp"].get_group())


def _widen_responses(mb: MicroBatch, width: int) -> MicroBatch:
    """Right-pad the response tensors to ``width`` columns (masked out).

    `response_logits` runs one model call when responses are one token wide and
    two otherwise; every rank must make the same calls, so all make two.
    """
    extra = width - mb.response_ids.shape[1]
    if extra <= 0:
        return mb

    def pad(t: torch.Tensor, value: float) -> torch.Tensor:
        return torch.nn.functional.pad(t, (0, extra), value=value)

    return dataclasses.replace(
        mb,
        response_ids=pad(mb.response_ids, 0),
        response_mask=pad(mb.response_mask, 0),
        loss_mask=pad(mb.loss_mask, 0),
        advantages=pad(mb.advantages, 0),
        behaviour_logprobs=pad(mb.behaviour_logprobs, 0),
    )


# --- the command loop -------------------------------------------------------------------


def _build(rank: int, spec: WorkerSpec) -> ShardedPolicyTrainer:
    join_group(rank, spec.world_size, spec.backend, spec.init_method, spec.timeout_s)
    return make_trainer(rank, spec, local_rank=rank, local_world_size=spec.world_size)


#: An ``init_method`` scheme of our own: the ranks meet at a TCPStore that another
#: process already serves (`host_store`), so no rank has to bind a port chosen earlier.
HOSTED_STORE = "store://"


def host_store(host: str = "127.0.0.1") -> tuple[dist.TCPStore, str]:
    """Serve a TCPStore on a port the kernel picks as it binds, and the ``init_method``
    that sends ranks to it. Rank 0 serving ``tcp://host:<a port found free>`` races any
    process that binds in between; this store holds its port from the start. Keep the
    store alive as long as the group (it is the group's rendezvous and barrier)."""
    store = dist.TCPStore(host, 0, is_master=True, wait_for_workers=False)
    return store, f"{HOSTED_STORE}{host}:{store.port}"


def join_group(rank: int, world_size: int, backend: str, init_method: str, timeout_s: float):
    """Join the trainer's process group. ``init_method``: ``tcp://host:port`` (rank 0
    serves the store there), ``env://``, or ``store://host:port`` (`host_store`)."""
    # DTensor logs a warning for every 2-D redistribution it runs as two collectives
    # (the gradient norm over dp_shard x tp): expected here, and noise in a run's log.
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    # With sequence parallelism the last decoder layer hands back its gathered output
    # as a view; nothing after it updates it in place (tested for parity), so FSDP's
    # warning about in-place ops on views is noise here.
    warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view")
    timeout = datetime.timedelta(seconds=timeout_s)
    if init_method.startswith(HOSTED_STORE):
        host, port = init_method.removeprefix(HOSTED_STORE).rsplit(":", 1)
        store = dist.TCPStore(host, int(port), is_master=False, timeout=timeout)
        dist.init_process_group(
            backend, store=store, rank=rank, world_size=world_size, timeout=timeout
        )
        return
    dist.init_process_group(
        backend, init_method=init_method, rank=rank, world_size=world_size, timeout=timeout
    )


def make_trainer(
    rank: int,
    spec: WorkerSpec,
    local_rank: int,
    local_world_size: int = 1,
    threads: int | None = None,
) -> ShardedPolicyTrainer:
    """This rank's trainer, once it is in the process group: the model loaded, laid out
    on the mesh, with its optimizer. ``local_*``: its place among the ranks of its host;
    ``threads``: torch threads (default: this host's cores over its ranks)."""
    from temper.models import load_model

    torch.set_num_threads(threads or max(1, (os.cpu_count() or 1) // local_world_size))
    device = torch.device("cpu")
    if spec.backend == "nccl":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    model = load_model(spec.model_path, dtype=torch.float32)
    ref = load_model(spec.ref_path, dtype=torch.float32) if spec.ref_path else None
    teacher = load_model(spec.teacher_path, dtype=torch.float32) if spec.teacher_path else None
    adapter = None
    if spec.lora is not None:  # before FSDP2 shards it, as the parent's copy was wrapped
        from temper.trainer.lora import LoraAdapter  # imports peft

        adapter = LoraAdapter.wrap(model, spec.lora)
        assert spec.lora_init is not None
        with torch.no_grad():
            loaded = model.load_state_dict(spec.lora_init, strict=False)
        if loaded.unexpected_keys:
            raise RuntimeError(f"the parent's adapters hold {loaded.unexpected_keys[:3]}")
    cls = PipelinedPolicyTrainer if spec.cfg.pp > 1 else ShardedPolicyTrainer
    return cls(model, spec, rank, device, ref_model=ref, teacher=teacher, adapter=adapter)


def _full_weights(trainer: ShardedPolicyTrainer) -> dict[str, torch.Tensor] | None:
    """The full weights for the run (a collective: every rank calls it): streamed into
    rank 0's sink bucket by bucket (returns None), or, with no bucket size, the full
    state dict on CPU, returned by rank 0 only. With ``[lora]``: the adapters alone."""
    if trainer.adapter is not None:
        return _adapter_weights(trainer)
    if trainer.sync_bucket_bytes > 0:
        sink = trainer.weight_sink if trainer.writes_weights else None
        if trainer.writes_weights and sink is None:
            raise RuntimeError(f"rank {trainer.rank} has no weight sink to stream into")
        stream_weights(trainer.model, sink, trainer.sync_bucket_bytes)
        return None
    weights = get_model_state_dict(trainer.model, options=FULL_CPU)
    return weights if trainer.rank == 0 else None


def _adapter_weights(trainer: ShardedPolicyTrainer) -> dict[str, torch.Tensor] | None:
    """The trainable (adapter) tensors, each gathered whole (a collective, in the same
    order on every rank), by the parent's names for them; rank 0 returns them."""
    out: dict[str, torch.Tensor] = {}
    for name, param in trainer.model.named_parameters():
        if param.requires_grad:
            whole = param.detach()
            whole = whole.full_tensor() if isinstance(whole, DTensor) else whole
            out[name] = whole.to("cpu", copy=True)
    return out if trainer.rank == 0 else None


def _attach_sink(trainer: ShardedPolicyTrainer, sink: dict[str, torch.Tensor] | None) -> None:
    """Rank 0 (with pipeline stages, each stage's first rank) keeps the run's
    shared-memory copy of the weights to stream into."""
    if trainer.writes_weights:
        trainer.weight_sink = sink


def _train_step(trainer: ShardedPolicyTrainer, trajs: list[Trajectory]) -> dict[str, Any]:
    unset = [i for i, t in enumerate(trajs) if t.trainer_logprobs is None]
    metrics = trainer.train_step(trajs)
    logprobs = {
        i: trajs[i].trainer_logprobs for i in unset if trajs[i].trainer_logprobs is not None
    }
    return {"metrics": metrics, "logprobs": logprobs, "weights": _full_weights(trainer)}


def _save(trainer: ShardedPolicyTrainer, path: str) -> None:
    _, state = dcp_state(trainer.model, trainer.optimizer, trainer.adapter is not None)
    dcp.save(state, checkpoint_id=path)


def _load_dcp(trainer: ShardedPolicyTrainer, arg: tuple[str, dict]) -> dict[str, Any]:
    path, scheduler = arg
    options, state = dcp_state(trainer.model, trainer.optimizer, trainer.adapter is not None)
    dcp.load(state, checkpoint_id=path)  # reshards: the writer's world size does not matter
    set_state_dict(
        trainer.model,
        trainer.optimizer,
        model_state_dict=state["model"],
        optim_state_dict=state["optim"],
        options=options,
    )
    trainer.scheduler.load_state_dict(scheduler)
    return {"weights": _full_weights(trainer)}


def _train_pairs(trainer: ShardedPolicyTrainer, pairs: list[ResponsePair]) -> dict[str, Any]:
    return {"metrics": trainer.train_pairs(pairs), "weights": _full_weights(trainer)}


HANDLERS = {
    "train_step": _train_step,
    "train_pairs": _train_pairs,
    # Every rank scores every row (FSDP needs the same forwards on all); rank 0 answers.
    "sequence_logprobs": lambda trainer, arg: trainer.sequence_logprobs(*arg),
    "save": _save,
    "load_dcp": _load_dcp,
    "scheduler_state": lambda trainer, _arg: trainer.scheduler.state_dict(),
    "attach_sink": _attach_sink,
    "sync_weights": lambda trainer, _arg: {"weights": _full_weights(trainer)},
}


def _next_command(conn: Connection, parent_pid: int) -> tuple[str, Any] | None:
    """The parent's next command; None once the parent is gone (so orphans exit)."""
    while not conn.poll(1.0):
        if os.getppid() != parent_pid:
            return None
    try:
        return conn.recv()
    except EOFError:
        return None


def run_worker(rank: int, spec: WorkerSpec, conn: Connection) -> None:
    """Build rank ``rank``'s trainer and serve the parent's commands until "close".

    Every reply is ``("ok", result)`` or ``("error", traceback)``; after an error
    the rank exits, since the others may be stuck in a collective it left.
    """
    try:
        trainer = _build(rank, spec)
        conn.send(("ok", None))
    except BaseException:
        conn.send(("error", traceback.format_exc()))
        return
    while (msg := _next_command(conn, spec.parent_pid)) is not None and msg[0] != "close":
        command, arg = msg
        try:
            result = HANDLERS[command](trainer, arg)
        except BaseException:
            conn.send(("error", traceback.format_exc()))
            return
        conn.send(("ok", result))
    dist.destroy_process_group()
    if msg is not None:  # a clean "close": say so; an orphan has no one to tell
        with contextlib.suppress(OSError):
            conn.send(("ok", None))
