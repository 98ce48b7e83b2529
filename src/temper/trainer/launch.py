"""`temper train` under a multi-host launcher: torchrun (c10d rendezvous) or mpirun.

Without a launcher, `DistributedTrainer` spawns its ranks on this host and
talks to them over pipes. Under a launcher every process it starts runs
`temper train` with the same arguments, on any number of hosts, and:

- **rank 0** runs the whole run (orchestrator, engine, evals, run directory)
  and is also trainer rank 0: `LaunchedTrainer`, with `DistributedTrainer`'s
  interface, sends each command (a step, a DCP save or load) to every rank by
  broadcast over the trainer's process group, runs it on its own shard, and
  gathers the replies;
- **every other rank** only trains (`serve_rank`): it joins the group, takes
  the trainer spec rank 0 broadcasts (so every rank builds the same model,
  whatever it would have resolved alone), and serves commands until "close".

`detect_launch` reads the launcher's environment: torchrun's ``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE`` (the group joins with
``env://``: torchrun sets ``MASTER_ADDR`` and ``MASTER_PORT``); OpenMPI's
``OMPI_COMM_WORLD_RANK``, ``..._SIZE``, ``..._LOCAL_RANK``, ``..._LOCAL_SIZE``,
where the address and port come from ``trainer.master_addr`` /
``trainer.master_port`` or else ``MASTER_ADDR`` / ``MASTER_PORT``.

DCP checkpoints are written by every rank into the run directory, so hosts
need a shared filesystem for ``checkpoint.every`` and resume (as with
torchtitan); the HF weights and the rest are written by rank 0.
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist

from temper.errors import ConfigError
from temper.trainer.dist_worker import HANDLERS, WorkerSpec, join_group, make_trainer

#: Launchers and their environment variables: rank, world size, local rank, local size.
LAUNCHERS = {
    "torchrun": ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"),
    "mpirun": (
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_SIZE",
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "OMPI_COMM_WORLD_LOCAL_SIZE",
    ),
}


@dataclass(frozen=True)
class Launch:
    """This process's place in a launched job."""

    launcher: str
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    init_method: str


def detect_launch(
    env: Mapping[str, str] | None = None,
    master_addr: str | None = None,
    master_port: int | None = None,
) -> Launch | None:
    """The launch this process is part of, or None (no launcher, or a job of one)."""
    env = os.environ if env is None else env
    for launcher, (rank, size, local, local_size) in LAUNCHERS.items():
        if rank not in env or size not in env:
            continue
        world = int(env[size])
        if world <= 1:
            return None
        addr = master_addr or env.get("MASTER_ADDR")
        port = master_port or (int(env["MASTER_PORT"]) if env.get("MASTER_PORT") else None)
        if launcher == "torchrun" and master_addr is None and master_port is None:
            init = "env://"
        elif addr and port:
            init = f"tcp://{addr}:{port}"
        else:
            raise ConfigError(
                f"started by {launcher} with {world} ranks but no rendezvous address: set "
                "trainer.master_addr and trainer.master_port, or MASTER_ADDR and MASTER_PORT"
            )
        return Launch(
            launcher=launcher,
            rank=int(env[rank]),
            world_size=world,
            local_rank=int(env.get(local, 0)),
            local_world_size=int(env.get(local_size, world)),
            init_method=init,
        )
    return None


def check_world_size(configured: int, launch: Launch) -> None:
    """A config's ``trainer.world_size`` must be 1 (take the launcher's) or the launcher's."""
    if configured not in (1, launch.world_size):
        raise ConfigError(
            f"trainer.world_size = {configured} but {launch.launcher} started "
            f"{launch.world_size} ranks; leave trainer.world_size unset under a launcher"
        )


def _weights_apart(result: Any) -> tuple[Any, Any]:
    """(the reply without its full weights, the weights): rank 0 keeps its weights
    local rather than pickling the whole model into the gather."""
    if isinstance(result, dict) and "weights" in result:
        return {k: v for k, v in result.items() if k != "weights"}, result["weights"]
    return result, None


def serve_rank(launch: Launch, backend: str, timeout_s: float) -> int:
    """A non-zero rank's whole life: join, build from rank 0's spec, serve until "close"."""
    join_group(launch.rank, launch.world_size, backend, launch.init_method, timeout_s)
    box: list[Any] = [None]
    dist.broadcast_object_list(box, src=0)
    trainer = make_trainer(launch.rank, box[0], launch.local_rank, launch.local_world_size)
    while True:
        box = [None]
        dist.broadcast_object_list(box, src=0)
        command, arg = box[0]
        if command == "close":
            break
        try:
            reply = ("ok", _weights_apart(HANDLERS[command](trainer, arg))[0])
        except Exception:
            reply = ("error", traceback.format_exc())
        dist.gather_object(reply, None, dst=0)
    dist.destroy_process_group()
    return 0


class LaunchedRanks:
    """Rank 0's side: its own trainer shard plus the command channel to the others.

    `DistributedTrainer` uses it in place of spawned processes and pipes
    (``DistributedTrainer.launched``)."""

    def __init__(self, launch: Launch, spec: WorkerSpec) -> None:
        self.launch = launch
        join_group(0, launch.world_size, spec.backend, launch.init_method, spec.timeout_s)
        dist.broadcast_object_list([spec], src=0)
        self.trainer = make_trainer(0, spec, launch.local_rank, launch.local_world_size)
        # The other ranks report failures to build in the first command's replies.
        self.startup: list[tuple[str, Any]] = [("ok", None)] * launch.world_size

    def request(self, command: str, arg: Any) -> list[tuple[str, Any]]:
        """Run ``command`` on every rank; each rank's ``(status, value)``, in rank order."""
        dist.broadcast_object_list([(command, arg)], src=0)
        try:
            status, local = "ok", HANDLERS[command](self.trainer, arg)
        except Exception:
            status, local = "error", traceback.format_exc()
        mine, weights = _weights_apart(local)
        replies: list[Any] = [None] * self.launch.world_size
        dist.gather_object((status, mine), replies, dst=0)
        if mine is not local:  # put rank 0's weights (None when streamed) back, unpickled
            replies[0] = (status, {**mine, "weights": weights})
        return replies

    def abort(self) -> None:
        """Nothing to do here: the launcher stops every rank when this process exits."""

    def close(self) -> None:
        if dist.is_initialized():
            dist.broadcast_object_list([("close", None)], src=0)
            dist.destroy_process_group()


__all__ = ["Launch", "LaunchedRanks", "check_world_size", "detect_launch", "serve_rank"]
