"""The run directory: `runs/<name>/` and what lives in it."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from temper.config import Config, dump_config
from temper.errors import ConfigError
from temper.rollout.trajectory import Trajectory


@dataclass
class RunDir:
    path: Path

    @property
    def metrics(self) -> Path:
        return self.path / "metrics.jsonl"

    @property
    def events(self) -> Path:
        return self.path / "events.jsonl"

    @property
    def checkpoints(self) -> Path:
        return self.path / "checkpoints"

    @property
    def eval_dir(self) -> Path:
        return self.path / "eval"

    @property
    def trajectories(self) -> Path:
        return self.path / "trajectories"

    @classmethod
    def prepare(cls, cfg: Config) -> RunDir:
        """Create (or reopen, when resuming) the run directory and write config.toml.

        Refuses to reuse a non-empty directory unless `run.resume` or
        `run.overwrite` is set, so no earlier run is lost by accident.
        """
        path = Path(cfg.run.output_dir) / cfg.run.name
        if path.exists() and any(path.iterdir()) and not cfg.run.resume:
            if not cfg.run.overwrite:
                raise ConfigError(
                    f"run directory {path} already exists; pass --run.overwrite=true to "
                    "replace it or --run.resume=true to continue it"
                )
            shutil.rmtree(path)
        for sub in ("", "checkpoints", "eval", "trajectories", "plots"):
            (path / sub).mkdir(parents=True, exist_ok=True)
        (path / "config.toml").write_text(dump_config(cfg))
        return cls(path)

    def write_eval(self, step: int, result: dict[str, Any]) -> None:
        (self.eval_dir / f"step_{step:06d}.json").write_text(
            json.dumps({"step": step, **result}, indent=1)
        )

    def write_trajectories(self, step: int, trajs: list[Trajectory]) -> None:
        with open(self.trajectories / f"step_{step:06d}.jsonl", "w") as f:
            for t in trajs:
                f.write(json.dumps(t.to_json()) + "\n")

    def drop_after(self, step: int) -> None:
        """Remove per-step artefacts past `step` (a resume rewrites them)."""
        for folder in (self.eval_dir, self.trajectories):
            for p in folder.glob("step_*"):
                if int(p.stem.split("_")[1]) > step:
                    p.unlink()
