"""`DistributedTrainer`: the `PolicyTrainer` interface over N FSDP2 trainer processes.

With ``trainer.world_size = N > 1`` the run's process does not train. It
spawns N ranks (`temper.trainer.dist_worker.run_worker`), all equal, that join
a process group (gloo on CPU, nccl on CUDA) at a TCPStore this process serves
on a port it holds from the start (`host_store`), and hold the model sharded with
FSDP2. Each `train_step` pickles the step's trajectories to every rank; every
rank trains on its slice of each mini-batch and FSDP sums the gradients. Rank 0
then sends back the metrics and the full weights, gathered to CPU, and the other
ranks the trainer logprobs of their rows. The full weights go into ``model``,
the parent's CPU copy of the policy: what the engine is updated from and what
the HF part of a checkpoint is saved from.

Checkpoints: `write_sharded_state` has each rank write its shards with DCP;
`load_checkpoint` loads a DCP checkpoint written at any world size, or a
world-size-1 checkpoint (full optimizer state in ``trainer.pt``).

With ``[lora]`` every rank, and the parent's copy, carry the same peft adapters
(`temper.trainer.lora`); FSDP2 shards the frozen base and the adapters alike, but
only the adapters get gradients and AdamW state. What comes back after a step is
the adapter alone, gathered whole (a few MB: no shared-memory streaming); the
engines get it as an adapter update, a checkpoint holds it in peft's format, and
the DCP shards hold only the adapters and their optimizer state.

Failure: every wait on a rank is bounded by ``trainer.worker_timeout_s`` and
checks that the ranks are alive. A rank that raises, dies or times out stops
all ranks and raises `TrainerWorkerError` naming the rank and the command.
"""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing as mp
import os
import tempfile
import time
import warnings
import weakref
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any, Protocol

import torch

from temper.config.algo import AlgoConfig
from temper.config.distill import DistillConfig
from temper.config.dpo import DPOConfig
from temper.config.lora import LoraConfig
from temper.config.trainer import TrainerConfig
from temper.errors import ConfigError
from temper.records import Trajectory
from temper.trainer.base import TrainerAbilities, TrainerDefaults
from temper.trainer.checkpoint import DCP_DIR, dcp_state
from temper.trainer.dist_worker import WorkerSpec, host_store, run_worker
from temper.trainer.expert_parallel import check_ep
from temper.trainer.launch import Launch, LaunchedRanks
from temper.trainer.optim import build_optimizer
from temper.trainer.parallel import check_tp
from temper.trainer.pipeline import check_pp
from temper.trainer.preference import ResponsePair
from temper.trainer.weight_stream import share_sink


class TrainerWorkerError(RuntimeError):
    """A trainer rank raised, died or did not answer in time; all ranks are stopped."""


def resolve_backend(backend: str | None, world_size: int) -> str:
    """The process-group backend: gloo on CPU, nccl on CUDA unless set; checks nccl can run."""
    cuda = torch.cuda.is_available()
    if backend is None:
        backend = "nccl" if cuda else "gloo"
    if backend == "nccl":
        if not cuda:
            raise ConfigError("trainer.backend = 'nccl' needs CUDA, and no GPU is visible")
        if torch.cuda.device_count() < world_size:
            raise ConfigError(
                f"trainer.world_size = {world_size} with nccl needs one GPU per rank; "
                f"{torch.cuda.device_count()} visible"
            )
    return backend


class RemoteRanks(Protocol):
    """Trainer ranks this process did not spawn (`LaunchedRanks`, `RayTrainerRanks`)."""

    #: Each rank's ``(status, value)`` from building its trainer.
    startup: list[tuple[str, Any]]

    def request(self, command: str, arg: Any) -> list[tuple[str, Any]]: ...
    def abort(self) -> None: ...
    def close(self) -> None: ...


def _spawn_rendezvous(cfg: TrainerConfig) -> tuple[Any, str]:
    """Where spawned ranks meet, and the store this process serves for them (None
    when ``trainer.master_port`` is set: rank 0 serves it there, as asked)."""
    host = cfg.master_addr or "127.0.0.1"
    if cfg.master_port:
        return None, f"tcp://{host}:{cfg.master_port}"
    return host_store(host)


def _check_layout(model: torch.nn.Module, cfg: TrainerConfig, algo: AlgoConfig) -> None:
    """Refuse a tp, ep or pp layout the model or run cannot take, in one line here
    rather than in every rank (ConfigError)."""
    if cfg.tp > 1:
        check_tp(model.config, cfg.tp)
    if cfg.ep > 1:
        check_ep(model, cfg.ep)
    if cfg.pp > 1:
        check_pp(model, cfg.pp)
        if algo.advantage in ("reinforce_pp", "distill") or cfg.weight_sync_bucket_mb == 0:
            raise ConfigError(
                f"trainer.pp = {cfg.pp} needs weight_sync_bucket_mb > 0 and an advantage "
                f"other than {algo.advantage!r} so far (its per-token advantages need "
                "whole-model logprobs on every stage)"
            )


class DistributedTrainer(TrainerDefaults):
    """Trains on ``cfg.world_size`` FSDP2 ranks; the same `Trainer` as `PolicyTrainer`.

    ``model`` is the parent's CPU copy of the policy, loaded from ``model_path``
    like each rank's; it is kept equal to the trained weights after every step
    and load. ``ref_path`` (a KL penalty's reference, or online DPO's) is loaded whole
    on every rank, and so is ``teacher_path`` (``algo.advantage = "distill"`` with a
    teacher in the trainer). ``lora``: train peft adapters over the frozen base
    (``cfg.lr`` is already the adapters' rate). ``dpo``: the loss of `train_pairs`.
    Call `close` when done (the orchestrator does); the ranks also exit if this
    process dies.
    """

    abilities = TrainerAbilities(sharded_state=True, preference=True)

    def __init__(
        self,
        model: torch.nn.Module,
        model_path: str,
        cfg: TrainerConfig,
        algo: AlgoConfig,
        total_steps: int,
        pad_id: int,
        ref_path: str | None = None,
        launch: Launch | None = None,
        distill: DistillConfig | None = None,
        teacher_path: str | None = None,
        lora: LoraConfig | None = None,
        dpo: DPOConfig | None = None,
    ) -> None:
        self.model, self.cfg, self.total_steps = model, cfg, total_steps
        self.world_size = cfg.world_size
        #: ``[lora]``: the parent's copy's adapters (what engines and checkpoints get).
        self.adapter = None
        if lora is not None:  # before spawning: a bad target module is one line here
            from temper.trainer.lora import LoraAdapter  # imports peft

            self.adapter = LoraAdapter.wrap(model, lora)
            self.abilities = TrainerAbilities(sharded_state=True, adapter=True, preference=True)
        _check_layout(model, cfg, algo)
        #: The spawned ranks' rendezvous store, served here for as long as they run.
        self._store, init_method = None, launch.init_method if launch else ""
        if launch is None and cfg.launcher != "ray":
            self._store, init_method = _spawn_rendezvous(cfg)
        spec = WorkerSpec(
            model_path=model_path,
            ref_path=ref_path,
            cfg=cfg,
            algo=algo,
            total_steps=total_steps,
            pad_id=pad_id,
            world_size=cfg.world_size,
            backend=resolve_backend(
                cfg.backend, launch.local_world_size if launch else cfg.world_size
            ),
            init_method=init_method,
            timeout_s=cfg.worker_timeout_s,
            parent_pid=os.getpid(),
            # An adapter comes back whole: it is too small to be worth streaming.
            sync_bucket_bytes=0 if lora else int(cfg.weight_sync_bucket_mb * 2**20),
            distill=distill if algo.advantage == "distill" else None,
            teacher_path=teacher_path if algo.advantage == "distill" else None,
            lora=lora,
            lora_init=self.adapter.trainable() if self.adapter is not None else None,
            dpo=dpo,
        )
        self._procs: list[Any] = []
        self._conns: list[Connection] = []
        #: Ranks this process does not spawn: launched by torchrun or mpirun (this
        #: process is rank 0), or Ray actors. None: spawned processes, over pipes.
        self._ranks: RemoteRanks | None = None
        if launch is not None:
            launched = LaunchedRanks(launch, spec)
            if spec.sync_bucket_bytes:  # rank 0 is this process: stream into the copy itself
                launched.trainer.weight_sink = dict(self.model.state_dict())
            self._ranks = launched
        elif cfg.launcher == "ray":
            from temper.trainer.ray_ranks import RayTrainerRanks

            # Weights come back through Ray's object store: no shared memory to stream into.
            self._ranks = RayTrainerRanks(dataclasses.replace(spec, sync_bucket_bytes=0), cfg)
        if self._ranks is not None:
            self._finalizer = weakref.finalize(self, self._ranks.close)
            self._check_replies(self._ranks.startup, "startup")
            return
        self._spawn(spec)

    def _spawn(self, spec: WorkerSpec) -> None:
        """Start the ranks as processes of this one, over pipes, and wait until they built."""
        cfg = self.cfg
        ctx = mp.get_context("spawn")  # fork would copy this process's threads and OpenMP state
        for rank in range(cfg.world_size):
            parent, child = ctx.Pipe()
            proc = ctx.Process(
                target=run_worker,
                args=(rank, spec, child),
                name=f"temper-trainer-{rank}",
                daemon=True,
            )
            proc.start()
            child.close()
            self._procs.append(proc)
            self._conns.append(parent)
        self._finalizer = weakref.finalize(self, _stop, self._procs, self._conns)
        self._collect("startup")
        if spec.sync_bucket_bytes:  # rank 0 streams into this copy, moved to shared memory
            sink = share_sink(self.model)
            # With pipeline stages, the first rank of each stage writes that stage's part.
            writers = range(0, cfg.world_size, cfg.world_size // cfg.pp)
            for rank, conn in enumerate(self._conns):
                conn.send(("attach_sink", sink if rank in writers else None))
            self._collect("attach_sink")

    # --- the Trainer protocol -------------------------------------------------------

    def train_step(self, trajs: list[Trajectory]) -> dict[str, float]:
        """One update on every rank; sets ``trainer_logprobs``; returns rank 0's metrics."""
        if not trajs:
            return {}
        results = self._request("train_step", trajs)
        for result in results:
            for i, logprobs in result["logprobs"].items():
                trajs[i].trainer_logprobs = logprobs
        self._adopt(results[0]["weights"])
        return results[0]["metrics"]

    def train_pairs(self, pairs: list[ResponsePair]) -> dict[str, float]:
        """One DPO update on every rank (each trains its slice of every mini-batch of
        pairs); returns rank 0's metrics, summed over the ranks."""
        if not pairs:
            return {}
        if any(p.ref_chosen is None or p.ref_rejected is None for p in pairs):
            raise ValueError("train_pairs: every pair needs its reference logprobs first")
        results = self._request("train_pairs", pairs)
        self._adopt(results[0]["weights"])
        return results[0]["metrics"]

    def sequence_logprobs(self, trajs: list[Trajectory], reference: bool = False) -> list[float]:
        """Each trajectory's summed logprob of its loss-masked tokens, no grad, under the
        policy now (``reference``: the frozen reference model on the ranks)."""
        return self._request("sequence_logprobs", (trajs, reference))[0]

    def engine_state_dict(self) -> dict[str, torch.Tensor]:
        """Current weights (the parent's copy), detached, for publishing to engines; with
        ``[lora]`` the adapter alone (`temper.weights.adapter`)."""
        if self.adapter is not None:
            return self.adapter.update()
        return {k: v.detach() for k, v in self.model.state_dict().items()}

    def saved_model(self) -> Any:
        """The HF model, or with ``[lora]`` peft's (a checkpoint then holds the adapter)."""
        return self.model if self.adapter is None else self.adapter.peft_model

    def state_dict(self) -> dict[str, Any]:
        """The part of the trainer state that goes into ``trainer.pt``; the rest is DCP."""
        scheduler = self._request("scheduler_state")[0]
        return {"format": "dcp", "world_size": self.world_size, "scheduler": scheduler}

    def write_sharded_state(self, directory: Path) -> None:
        """Every rank writes its model and optimizer shards to ``directory/dcp`` (DCP)."""
        self._request("save", str(Path(directory) / DCP_DIR))

    def load_checkpoint(self, ckpt: Path, trainer_state: dict[str, Any]) -> None:
        """Load weights, optimizer and scheduler from checkpoint dir ``ckpt``, any world size.

        A world-size-1 checkpoint is first rewritten as a one-shard DCP checkpoint
        (in a temporary directory), so both kinds load through DCP's resharding.
        """
        scheduler = trainer_state["scheduler"]
        if self.adapter is not None:  # refuses an adapter of another rank or layers
            self.adapter.load(Path(ckpt))
        if trainer_state.get("format") == "dcp":
            results = self._request("load_dcp", (str(Path(ckpt) / DCP_DIR), scheduler))
        else:
            with tempfile.TemporaryDirectory(prefix="temper-dcp-") as tmp:
                self._plain_to_dcp(Path(ckpt), trainer_state, Path(tmp))
                results = self._request("load_dcp", (tmp, scheduler))
        self._adopt(results[0]["weights"])

    def close(self) -> None:
        """Ask every rank to exit; stop any that do not within a few seconds."""
        self._finalizer()

    # --- internals -------------------------------------------------------------------

    def _plain_to_dcp(self, ckpt: Path, trainer_state: dict[str, Any], out: Path) -> None:
        """Write a world-size-1 checkpoint's weights and AdamW state to ``out`` as DCP.

        `PolicyTrainer` saves AdamW's state keyed by parameter position; DCP keys
        it by name. An AdamW over the parent's copy of the model translates.
        """
        import torch.distributed.checkpoint as dcp
        from safetensors.torch import load_file

        if self.adapter is None:  # with [lora], `load_checkpoint` read the adapter already
            weights: dict[str, torch.Tensor] = {}
            for file in sorted(ckpt.glob("*.safetensors")):
                weights.update(load_file(str(file)))
            if weights:
                self.model.load_state_dict(weights, strict=False)  # a tied head is saved once
        optimizer, _ = build_optimizer(self.model, self.cfg, self.total_steps)
        optimizer.load_state_dict(trainer_state["optimizer"])
        _, state = dcp_state(self.model, optimizer, self.adapter is not None)
        with warnings.catch_warnings():  # DCP warns that it assumes one process: we mean it
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.save(state, checkpoint_id=str(out), no_dist=True)

    def _adopt(self, weights: dict[str, torch.Tensor] | None) -> None:
        """Load weights rank 0 sent (with ``[lora]``: the adapters'); None: it already
        streamed them into this copy."""
        if weights is None:
            return
        with torch.no_grad():
            result = self.model.load_state_dict(weights, strict=self.adapter is None)
        if result.unexpected_keys:  # the ranks' adapters are this copy's, name for name
            raise TrainerWorkerError(f"rank 0 sent unknown tensors {result.unexpected_keys[:3]}")

    def _request(self, command: str, arg: Any = None) -> list[Any]:
        if not self._finalizer.alive:
            raise TrainerWorkerError(f"the trainer ranks are stopped; cannot run {command}")
        if self._ranks is not None:
            return self._check_replies(self._ranks.request(command, arg), command)
        for rank, conn in enumerate(self._conns):
            try:
                conn.send((command, arg))
            except OSError as exc:
                self._fail(f"trainer rank {rank} is gone ({exc}) before {command}")
        return self._collect(command)

    def _check_replies(self, replies: list[tuple[str, Any]], command: str) -> list[Any]:
        """The values of remote ranks' replies; raises on the first that failed."""
        for rank, (status, value) in enumerate(replies):
            if status == "died":
                self._fail(value)
            if status == "error":
                self._fail(f"trainer rank {rank} failed during {command}", value)
        return [value for _, value in replies]

    def _collect(self, command: str) -> list[Any]:
        """Each rank's reply to ``command``, in rank order; raises if one fails."""
        results: dict[int, Any] = {}
        deadline = time.monotonic() + self.cfg.worker_timeout_s
        while len(results) < self.world_size:
            pending = [r for r in range(self.world_size) if r not in results]
            waitables = [self._conns[r] for r in pending] + [
                self._procs[r].sentinel for r in pending
            ]
            wait(waitables, timeout=min(1.0, max(0.0, deadline - time.monotonic())))
            for rank in pending:
                conn = self._conns[rank]
                if conn.poll():
                    try:
                        status, value = conn.recv()
                    except (EOFError, OSError):  # the rank died mid-reply
                        status, value = "died", None
                    if status == "ok":
                        results[rank] = value
                        continue
                    if status == "error":
                        self._fail_on_error(rank, command, value)
                if not self._procs[rank].is_alive():
                    code = self._procs[rank].exitcode
                    self._fail(f"trainer rank {rank} exited (code {code}) during {command}")
            if len(results) < self.world_size and time.monotonic() > deadline:
                self._fail(
                    f"trainer ranks {pending} did not finish {command} within "
                    f"trainer.worker_timeout_s = {self.cfg.worker_timeout_s:g}s"
                )
        return [results[r] for r in range(self.world_size)]

    def _fail_on_error(self, rank: int, command: str, worker_traceback: str) -> None:
        # A rank that died makes the others' collectives fail: name the dead one.
        time.sleep(0.2)
        dead = [r for r, proc in enumerate(self._procs) if r != rank and not proc.is_alive()]
        if dead:
            code = self._procs[dead[0]].exitcode
            self._fail(f"trainer rank {dead[0]} exited (code {code}) during {command}")
        self._fail(f"trainer rank {rank} failed during {command}", worker_traceback)

    def _fail(self, message: str, worker_traceback: str | None = None) -> None:
        # The other ranks may be blocked in a collective: no point asking them to close.
        if self._finalizer.detach() is not None:
            _stop(self._procs, self._conns, grace_s=0.0)
            if self._ranks is not None:
                self._ranks.abort()
        if worker_traceback:
            last = worker_traceback.strip().splitlines()[-1]
            message = f"{message}: {last}\n--- rank traceback ---\n{worker_traceback}"
        raise TrainerWorkerError(message)


def _stop(procs: list[Any], conns: list[Connection], grace_s: float = 5.0) -> None:
    """Ask the ranks to close, then terminate (and kill) any still running."""
    for proc, conn in zip(procs, conns, strict=True):
        if proc.is_alive():
            with contextlib.suppress(OSError):
                conn.send(("close", None))
    deadline = time.monotonic() + grace_s
    for proc in procs:
        proc.join(max(0.0, deadline - time.monotonic()))
    for proc in procs:
        if proc.is_alive():
            proc.terminate()
            proc.join(2.0)
        if proc.is_alive():
            proc.kill()
            proc.join()
    for conn in conns:
        conn.close()
