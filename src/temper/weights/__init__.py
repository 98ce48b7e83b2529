"""temper.weights: versioned weight transports from trainer to engines."""

from temper.weights.broadcast import BroadcastTransport
from temper.weights.placement import local_transport, push_weights
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
    "local_transport",
    "push_weights",
]
