"""temper.weights: versioned weight transports from trainer to engines.

`WeightTransport` (`transport.py`) is the protocol: ``publish(state_dict, version)``,
``receive(version)``, ``latest_version()``. `choose.py` picks the transport for where
a run's engines are, and says which transports are library-only. The
transports: in-process and shared-memory file (`transport.py`), shared-memory
ring (`shm_ring.py`), safetensors files (`safetensors_file.py`),
`torch.distributed` broadcast (`broadcast.py`). `adapter.py` is what a LoRA update
is as a state dict (two small tensors per adapted layer) and how an engine merges it
into its kept base weights. See docs/weights.md.
"""

from temper.weights.broadcast import BroadcastTransport
from temper.weights.choose import push_weights, ring_reader, trainer_transport
from temper.weights.safetensors_file import SafetensorsFileTransport
from temper.weights.shm_ring import SharedMemoryRingTransport
from temper.weights.transport import (
    InProcessTransport,
    Manifest,
    SharedMemoryTransport,
    TensorEntry,
    WeightTransport,
    WeightTransportError,
)

__all__ = [
    "BroadcastTransport",
    "InProcessTransport",
    "Manifest",
    "SafetensorsFileTransport",
    "SharedMemoryRingTransport",
    "SharedMemoryTransport",
    "TensorEntry",
    "WeightTransport",
    "WeightTransportError",
    "push_weights",
    "ring_reader",
    "trainer_transport",
]
