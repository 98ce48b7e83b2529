"""Which transport carries weights from the trainer to the engines, by placement.

Every path from a trainer to an engine goes through a `WeightTransport`:

| placement | transport | why |
|---|---|---|
| `local` (engine in the trainer's process) | `InProcessTransport(copy=False)` | the engine copies into its own buffers on load, so handing over references costs nothing extra |
| `process` / `ray` (engines in worker processes on this node) | `SharedMemoryRingTransport` (built by the rollout backend) | workers map the slot zero-copy |
| `files` (an external engine that loads from disk) | `SafetensorsFileTransport` | |
| `broadcast` (trainer and engines in one `torch.distributed` group) | `BroadcastTransport` (gloo on CPU, nccl on GPU) | |

`push_weights` is the one-shot form for scripts and tests: it publishes a state
dict into a fresh in-process transport and has the engine load it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from temper.weights.transport import InProcessTransport


def local_transport() -> InProcessTransport:
    """The transport for an engine in the trainer's process.

    References, not copies (the engine copies on load and the trainer does not
    touch the tensors until the load returned); no checksums (nothing crosses a
    process boundary); one version kept.
    """
    return InProcessTransport(copy=False, verify=False, keep=1)


def push_weights(engine: Any, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
    """Publish ``state_dict`` as ``version`` and have ``engine`` load it (one call)."""
    transport = local_transport()
    transport.publish(state_dict, version)
    engine.load_weights(transport, version)
