"""Weights out of the sharded trainer, bucket by bucket, into one CPU copy in place.

After every step (and every checkpoint load) the run's process needs the full
weights: its engines and its HF checkpoints read them from one CPU copy of
the model. Gathering the whole state dict on rank 0 and pickling it through
a pipe (`gather_state_dict`, the old way) costs rank 0 a second full copy of
the model, and the pipe a third.

`stream_weights` instead walks the model's tensors in a fixed order, gathers
the full value of up to ``bucket_bytes`` of them at a time on every rank
(``DTensor.full_tensor``: a collective, so every rank walks the same order),
and rank 0 copies each into ``sink``, the run's CPU copy (in shared memory
when rank 0 is another process: the parent sends its tensors once,
`share_sink`), then drops the bucket. Rank 0's extra memory is then one bucket
(at least the largest single tensor), whatever the model's size; nothing is
pickled. Tied tensors (an output layer sharing the embeddings) are gathered
once.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import torch
from torch.distributed.tensor import DTensor


def _buckets(
    tensors: list[tuple[str, torch.Tensor]], bucket_bytes: int
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Consecutive groups of ``tensors`` of at most ``bucket_bytes`` full bytes (a tensor
    larger than that is a bucket alone)."""
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, t in tensors:
        full = t.numel() * t.element_size()  # a DTensor's numel is its global size
        if bucket and size + full > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, t))
        size += full
    if bucket:
        yield bucket


def stream_weights(
    model: torch.nn.Module, sink: Mapping[str, torch.Tensor] | None, bucket_bytes: int
) -> int:
    """Copy ``model``'s full weights into ``sink`` (rank 0; None elsewhere) bucket by
    bucket; every rank calls it. Returns the largest bucket's bytes held at once."""
    seen: dict[int, str] = {}
    tensors: list[tuple[str, torch.Tensor]] = []
    aliases: list[tuple[str, str]] = []
    for name, t in model.state_dict(keep_vars=True).items():
        if id(t) in seen:  # a tied tensor: copy it from its first name
            aliases.append((name, seen[id(t)]))
            continue
        seen[id(t)] = name
        tensors.append((name, t))
    largest = 0
    with torch.no_grad():
        for bucket in _buckets(tensors, bucket_bytes):
            full = [(n, t.full_tensor() if isinstance(t, DTensor) else t) for n, t in bucket]
            largest = max(largest, sum(f.numel() * f.element_size() for _, f in full))
            if sink is not None:
                for name, value in full:
                    sink[name].copy_(value.detach())
            del full
        if sink is not None:
            for name, first in aliases:
                if sink[name].data_ptr() != sink[first].data_ptr():
                    sink[name].copy_(sink[first])
    return largest


def share_sink(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """``model``'s tensors moved into shared memory, by state-dict name: what a rank in
    another process writes the weights into (sent to it once, through a pipe)."""
    model.share_memory()
    return dict(model.state_dict())
