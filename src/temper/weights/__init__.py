"""temper.weights: versioned weight transports from trainer to engines."""

from temper.weights.transport import (
    InProcessTransport,
    Manifest,
    SafetensorsFileTransport,
    SharedMemoryTransport,
    TensorEntry,
    WeightTransport,
    WeightTransportError,
)

__all__ = [
    "InProcessTransport",
    "Manifest",
    "SafetensorsFileTransport",
    "SharedMemoryTransport",
    "TensorEntry",
    "WeightTransport",
    "WeightTransportError",
]
