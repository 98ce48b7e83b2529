"""The run directory: `runs/<name>/` and what lives in it.

Opening a run is two steps, so that nothing is lost by mistake:

- `RunDir.open(cfg)` only looks: it checks that the output directory can hold
  the run, decides whether this start is fresh, a resume or an overwrite, and
  refuses what would lose work (an existing run without `run.overwrite`, a
  resume with nothing to resume). It changes nothing on disk.
- `RunDir.create()` writes: it replaces the old run (overwrite), makes the
  folders, removes half-written checkpoints a killed run left, and records the
  config. The orchestrator calls it once the config, model, data and reward
  have been checked, so an overwrite whose new config fails keeps the old run.

A directory that holds no results (no step metrics, checkpoint, eval or
trajectory: what a failed start leaves) never blocks a new start.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from temper.config import Config, dump_config
from temper.errors import ConfigError, DataError, TemperError
from temper.monitor.sinks import read_jsonl
from temper.records import Trajectory
from temper.trainer.checkpoint import list_checkpoints, remove_partial_checkpoints

#: Settings that may differ between a run and its resume without being recorded.
_RESUME_FREE = {"run.resume", "run.overwrite", "run.threads", "log.progress"}

#: errno values that mean "the disk cannot take more".
_FULL = {errno.ENOSPC, errno.EDQUOT}
#: errno values that mean "this place cannot be written".
_UNWRITABLE = {errno.EROFS, errno.EACCES, errno.EPERM}


@dataclass
class RunDir:
    path: Path
    #: The checkpoint a resume continues from; None for a fresh start.
    resume_from: Path | None = None
    #: Old results this start replaces (run.overwrite, or run.resume = "auto" with
    #: no checkpoint): deleted by `create`, not before.
    replaces_old: bool = False
    #: A resume whose config differs from the run's: {dotted key: (old, new)}.
    config_changes: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    _created: bool = False

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
        """`open` and `create` in one go (for callers with nothing to check in between)."""
        run = cls.open(cfg)
        run.create(cfg)
        return run

    @classmethod
    def open(cls, cfg: Config) -> RunDir:
        """Decide how this start uses the run directory; change nothing on disk.

        Raises ConfigError when the output directory cannot hold the run, when a
        run with results is there and neither `run.overwrite` nor `run.resume`
        is set, and when `run.resume = true` finds no checkpoint to resume from
        (`run.resume = "auto"` then starts fresh instead).
        """
        path = Path(cfg.run.output_dir) / cfg.run.name
        _check_writable(path)
        results = holds_results(path)
        ckpts = list_checkpoints(path / "checkpoints")
        resume = cfg.run.resume
        if resume and ckpts:
            run = cls(path, resume_from=ckpts[-1])
            run.config_changes = _config_changes(path / "config.toml", cfg)
            return run
        if resume is True:
            what = "has no checkpoint" if path.exists() else "does not exist"
            raise ConfigError(
                f"run.resume: {path} {what}, so there is nothing to resume; "
                'run.resume = "auto" starts fresh when there is no checkpoint'
            )
        if results and not (cfg.run.overwrite or resume == "auto"):
            raise ConfigError(
                f"run directory {path} already exists; pass --run.overwrite=true to "
                "replace it or --run.resume=true to continue it"
            )
        return cls(path, replaces_old=path.exists())

    def create(self, cfg: Config) -> None:
        """Make the run directory on disk (see the module docstring); once only."""
        if self._created:
            return
        try:
            if self.replaces_old and self.resume_from is None:
                shutil.rmtree(self.path)
            for sub in ("", "checkpoints", "eval", "trajectories", "plots"):
                (self.path / sub).mkdir(parents=True, exist_ok=True)
            remove_partial_checkpoints(self.checkpoints)
            if self.resume_from is None:
                (self.path / "config.toml").write_text(dump_config(cfg))
            elif self.config_changes:
                step = self.resume_from.name.split("_")[1]
                (self.path / f"config.resumed_step_{step}.toml").write_text(dump_config(cfg))
        except OSError as err:
            raise write_error(err, self.path) from err
        self._created = True

    def abandon(self) -> None:
        """After a failed start: remove a directory this start made and left without results."""
        if self._created and self.resume_from is None and not holds_results(self.path):
            shutil.rmtree(self.path, ignore_errors=True)

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


def holds_results(path: Path) -> bool:
    """Whether a run directory holds anything a run produced (a step, checkpoint, eval...)."""
    if not path.is_dir():
        return False
    metrics = path / "metrics.jsonl"
    if metrics.is_file() and metrics.stat().st_size > 0:
        return True
    if list_checkpoints(path / "checkpoints"):
        return True
    for folder in ("eval", "trajectories"):
        if any((path / folder).glob("step_*")):
            return True
    known = {"config.toml", "metrics.jsonl", "events.jsonl", "checkpoints", "eval",
             "trajectories", "plots", "workers"}  # fmt: skip
    return any(p.name not in known for p in path.iterdir())  # something else: keep it


def write_error(err: OSError, path: Path) -> TemperError:
    """A one-line error for a run directory that cannot be written (full, read-only)."""
    where = err.filename or path
    if err.errno in _FULL:
        what = f"{where} (run directory {path})" if err.filename else f"the run directory {path}"
        return TemperError(
            f"no space left on device while writing {what}; checkpoints written before are "
            "intact: free space and continue with --run.resume=true"
        )
    reason = os.strerror(err.errno) if err.errno else str(err)
    return TemperError(f"cannot write the run directory {path}: {where}: {reason}")


def is_write_error(err: BaseException, path: Path) -> bool:
    """An OSError that means the disk is full, or that run directory ``path`` is not writable."""
    if not isinstance(err, OSError):
        return False
    if err.errno in _FULL:
        return True
    inside = err.filename is None or Path(str(err.filename)).is_relative_to(path)
    return err.errno in _UNWRITABLE and inside


def _check_writable(path: Path) -> None:
    """Refuse, with one line, an output directory where the run cannot be written."""
    probe = path
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        raise ConfigError(
            f"run.output_dir: {probe} is a file, not a directory (run directory {path})"
        )
    if not os.access(probe, os.W_OK | os.X_OK):
        reason = "read-only file system" if _read_only(probe) else "permission denied"
        raise ConfigError(f"run.output_dir: cannot write {probe} ({reason})")


def _read_only(path: Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def _flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _config_changes(old_file: Path, cfg: Config) -> dict[str, tuple[Any, Any]]:
    """Settings of ``cfg`` that differ from the run's recorded config.toml."""
    if not old_file.is_file():
        return {}
    try:
        old = _flatten(tomllib.loads(old_file.read_text()))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
        raise ConfigError(f"run.resume: {old_file} is not a valid config ({err})") from err
    new = _flatten(tomllib.loads(dump_config(cfg)))
    keys = (old.keys() | new.keys()) - _RESUME_FREE
    return {k: (old.get(k), new.get(k)) for k in sorted(keys) if old.get(k) != new.get(k)}


def load_recorded_groups(folder: str | None, step: int) -> tuple[list[list[Trajectory]], dict]:
    """The trajectories recorded at ``step`` in ``folder``, grouped by ``group_id``."""
    path = Path(str(folder)) / f"step_{step:06d}.jsonl"
    if not path.is_file():
        raise DataError(
            f"orchestrator.train_from: no recorded trajectories for step {step} ({path})"
        )
    groups: dict[int, list[Trajectory]] = {}
    for record in read_jsonl(path):
        record["trainer_logprobs"] = None  # recomputed by this run's trainer
        traj = Trajectory(**record)
        groups.setdefault(traj.group_id, []).append(traj)
    stats = {"time_generate_s": 0.0, "time_reward_s": 0.0, "reward_errors": 0.0}
    return list(groups.values()), stats
