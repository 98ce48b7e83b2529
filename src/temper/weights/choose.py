"""Which transport carries weights from the trainer to the engines, chosen by where the
engines are. Every backend gets its transport here.

| engines | transport | why |
|---|---|---|
| `"in_process"`: one engine in the trainer's process (the local backend) | `InProcessTransport(copy=False)` | the engine copies into its own buffers on load, so handing over references costs nothing extra |
| `"workers"`: engines in rollout worker processes or Ray actors, fed from this node (the process and Ray backends) | `SharedMemoryRingTransport` under `/dev/shm` | workers map a slot zero-copy while the next version is written to the other; the Ray pool reads it and ships each version through Ray's object store |

Library only, reached by no run config: `SafetensorsFileTransport` (for an
external engine that loads from disk), `SharedMemoryTransport` (one file per
version; the ring replaced it in runs) and `BroadcastTransport`
(`torch.distributed` broadcast, gloo on CPU and NCCL on GPU, for trainer and
engines in one process group). Each is tested and measured
(`benchmarks/weight_sync.py`); none has a backend that places engines where it
would be the right choice yet, and the NCCL path is unverified on a GPU.

`push_weights` is the one-shot form for scripts, tests and Ray actors: it
publishes a state dict into a fresh in-process transport and has the engine load it.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, overload

import torch

from temper.processes import pid_alive
from temper.weights.shm_ring import SharedMemoryRingTransport
from temper.weights.transport import InProcessTransport, WeightTransport

#: Where a run's engines are, as far as weights are concerned.
EnginePlacement = Literal["in_process", "workers"]


@overload
def trainer_transport(
    engines: Literal["in_process"], run_name: str = "run"
) -> InProcessTransport: ...
@overload
def trainer_transport(
    engines: Literal["workers"], run_name: str = "run"
) -> SharedMemoryRingTransport: ...
def trainer_transport(engines: EnginePlacement, run_name: str = "run") -> WeightTransport:
    """The transport a run's trainer publishes to, for engines placed as ``engines``.

    ``"in_process"``: references, not copies (the engine copies on load and the
    trainer does not touch the tensors until the load returned); no checksums
    (nothing crosses a process boundary); one version kept. ``"workers"``: a fresh
    shared-memory ring of this run and process (`ring_root`).
    """
    if engines == "in_process":
        return InProcessTransport(copy=False, verify=False, keep=1)
    return SharedMemoryRingTransport(ring_root(run_name))


def ring_reader(root: str | os.PathLike[str]) -> SharedMemoryRingTransport:
    """A worker's view of the ring a trainer publishes to under ``root``."""
    return SharedMemoryRingTransport(root)


def ring_root(run_name: str) -> Path:
    """A fresh ring directory for this run and process; removes rings of dead runs."""
    base = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", run_name)
    for old in base.glob(f"temper-ring-{safe}-*"):
        pid = old.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not pid_alive(int(pid)):
            shutil.rmtree(old, ignore_errors=True)  # left by a run that was SIGKILLed
    return base / f"temper-ring-{safe}-{os.getpid()}"


def push_weights(engine: Any, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
    """Publish ``state_dict`` as ``version`` and have ``engine`` load it (one call)."""
    transport = trainer_transport("in_process")
    transport.publish(state_dict, version)
    engine.load_weights(transport, version)
