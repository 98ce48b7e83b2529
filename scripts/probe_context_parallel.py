"""Does PyTorch's context parallelism run on this machine? Two gloo ranks on CPU try
`torch.distributed.tensor.experimental.context_parallel` around one causal SDPA call
(what ring attention over a sequence split in two would run), and `all_to_all_single`
(what expert parallelism's token dispatch needs). Prints one line per rank and probe.

    .venv/bin/python scripts/probe_context_parallel.py
"""

from __future__ import annotations

import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F


def _probe(rank: int, port: int) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    out = torch.empty(4)
    try:
        dist.all_to_all_single(out, torch.arange(4.0) + 10 * rank)
        print(f"rank {rank}: all_to_all_single ok {out.tolist()}", flush=True)
    except Exception as exc:  # report, do not stop: the next probe is independent
        print(f"rank {rank}: all_to_all_single failed: {exc}", flush=True)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel

    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("cp",))
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 8, 4) for _ in range(3))
    try:
        with context_parallel(mesh, buffers=[q, k, v], buffer_seq_dims=[2, 2, 2]):
            F.scaled_dot_product_attention(q, k, v, is_causal=True)
        print(f"rank {rank}: context_parallel ok", flush=True)
    except Exception as exc:
        print(f"rank {rank}: context_parallel failed: {type(exc).__name__}: {exc}", flush=True)
    dist.destroy_process_group()


def main() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_probe, args=(port,), nprocs=2)


if __name__ == "__main__":
    main()
