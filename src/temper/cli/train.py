"""`temper train`: one run, start to end, or (under torchrun or mpirun) one trainer rank."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any


def cmd_train(args: argparse.Namespace, overrides: list[str]) -> int:
    """Run training. Exit codes: 0 done; 2 bad input, or the run directory cannot be
    written (full disk, read-only); 3 stopped by a health check (the run could not
    learn); 130 interrupted (a checkpoint was written; continue with --run.resume=true).
    """
    from temper.config import load_config

    # The config is checked before torch, transformers and the orchestrator load: a
    # mistyped key is reported at once, not after seconds of imports.
    cfg = load_config(args.config, overrides)
    from temper.builder.model import quiet_libraries
    from temper.orchestrator.loop import Orchestrator
    from temper.orchestrator.run_dir import is_write_error, write_error

    quiet_libraries()  # trainer ranks under a launcher load their model without the builder
    if (served := _serve_launched_rank(cfg)) is not None:
        return served
    if args.profile and cfg.log.profile_step is None:
        cfg.log.profile_step = 1  # a step chosen in the config or overrides wins
    run_path = Path(cfg.run.output_dir) / cfg.run.name

    async def go() -> tuple[dict, Orchestrator]:
        orch = Orchestrator(cfg)
        try:
            return await orch.run(), orch
        finally:
            await orch.close()

    try:
        final, orch = asyncio.run(go())
    except OSError as err:
        if is_write_error(err, run_path):
            raise write_error(err, run_path) from err
        raise
    print(f"run directory: {run_path}  report: {run_path / 'report.html'}")
    if orch.guard.interrupted_at is not None:
        step = orch.guard.interrupted_at
        saved = f"checkpoint step_{step} written" if step > orch.start_step else "no new step"
        print(
            f"temper: interrupted at step {step} ({saved}); continue with --run.resume=true",
            file=sys.stderr,
        )
        return 130
    if final:
        print(json.dumps({k: v for k, v in final.items() if not isinstance(v, dict)}))
    if orch.guard.stop_reason:
        print(f"temper: error: {orch.guard.stop_reason}", file=sys.stderr)
        return 3
    return 0


def _serve_launched_rank(cfg: Any) -> int | None:
    """Under torchrun or mpirun, a rank other than 0 only trains (`temper.trainer.launch`):
    its exit code; None for rank 0 and for runs without a launcher."""
    from temper.trainer.launch import check_world_size, detect_launch

    t = cfg.trainer
    launch = detect_launch(master_addr=t.master_addr, master_port=t.master_port)
    if launch is None or launch.rank == 0:
        return None
    from temper.trainer.distributed import resolve_backend
    from temper.trainer.launch import serve_rank

    check_world_size(t.world_size, launch)
    return serve_rank(
        launch, resolve_backend(t.backend, launch.local_world_size), t.worker_timeout_s
    )
