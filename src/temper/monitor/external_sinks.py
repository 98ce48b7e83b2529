"""Optional metric sinks: TensorBoard, Weights & Biases and MLflow.

Chosen by `log.sinks`; each writes the numeric scalars of every metrics record
(`numeric_scalars`) at the record's ``step``. ``metrics.jsonl`` stays the
record of truth; these sinks are views for the tools people already use.

Each sink imports its package inside its constructor, never at module import,
so the core install needs none of them. `check_sinks` imports the packages up
front and raises a one-line `ConfigError` naming the missing package and the
pip extra that brings it, so a run fails at startup, not after loading models.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

from temper.errors import ConfigError
from temper.monitor.sinks import numeric_scalars

# sink name -> (module to import, pip extra of temper-rl that installs it)
SINK_PACKAGES: dict[str, tuple[str, str]] = {
    "tensorboard": ("tensorboard", "tensorboard"),
    "wandb": ("wandb", "wandb"),
    "mlflow": ("mlflow", "mlflow"),
}


def require(sink: str) -> ModuleType:
    """Import the package behind ``sink``; raise a one-line ConfigError if it is missing."""
    module, extra = SINK_PACKAGES[sink]
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ConfigError(
            f"log.sinks includes {sink!r} but the {module!r} package is not installed: "
            f"pip install 'temper-rl[{extra}]'"
        ) from None


def check_sinks(names: list[str]) -> None:
    """Fail fast (ConfigError) if a package behind one of ``names`` cannot be imported."""
    for name in names:
        require(name)


class TensorBoardSink:
    """Scalars as TensorBoard event files under ``log_dir`` (one tag per metric name).

    ``purge_step`` (set on resume) tells TensorBoard to discard points an
    earlier process wrote at or after that step, so a resumed run's curves
    have no duplicates from the steps past its checkpoint.
    """

    def __init__(self, log_dir: Path, purge_step: int | None = None) -> None:
        require("tensorboard")
        from torch.utils.tensorboard import SummaryWriter

        self.log_dir = log_dir
        self.writer = SummaryWriter(log_dir=str(log_dir), purge_step=purge_step)

    def write(self, record: dict[str, Any]) -> None:
        step = int(record.get("step", 0))
        for key, value in numeric_scalars(record).items():
            self.writer.add_scalar(key, value, step)
        # Flush every record: a live TensorBoard sees each step, a crash loses none.
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbSink:
    """A W&B run; ``mode="offline"`` (the default) writes it locally for a later `wandb sync`.

    The run's files go under ``$WANDB_DIR`` when that is set, else under
    ``directory`` (the run directory): ``<dir>/wandb/offline-run-*/``.
    Each sink starts its own run (``reinit="create_new"``) and leaves any
    other W&B run of the process alone.
    """

    def __init__(
        self,
        directory: Path,
        project: str,
        name: str,
        mode: str = "offline",
        entity: str | None = None,
        config: dict[str, Any] | None = None,
    ) -> None:
        wandb = require("wandb")
        kwargs: dict[str, Any] = {}
        if not os.environ.get("WANDB_DIR"):
            kwargs["dir"] = str(directory)
        self._exit_before = sys.exit
        self.run = wandb.init(
            project=project,
            entity=entity,
            name=name,
            mode=mode,
            config=config,
            reinit="create_new",
            # console="off": W&B would otherwise wrap stdout/stderr under the progress bar.
            settings=wandb.Settings(console="off", silent=True),
            **kwargs,
        )

    def write(self, record: dict[str, Any]) -> None:
        self.run.log(numeric_scalars(record), step=int(record.get("step", 0)))

    def close(self) -> None:
        self.run.finish()
        # wandb.init replaces sys.exit with its own hook and keeps it after finish();
        # put ours back so later code (and pickling sys.exit by name) sees the real one.
        if sys.exit is not self._exit_before:
            sys.exit = self._exit_before


_MLFLOW_BAD_CHARS = re.compile(r"[^\w\-. :/]")


def mlflow_key(key: str) -> str:
    """An MLflow-legal metric name: ``pass@1`` -> ``pass_at_1``; other odd chars -> ``_``."""
    return _MLFLOW_BAD_CHARS.sub("_", key.replace("@", "_at_"))


def _is_file_store(uri: str) -> bool:
    return uri.startswith("file:") or "://" not in uri


class MlflowSink:
    """One MLflow run in ``experiment`` at ``tracking_uri`` (created if missing).

    Metric names MLflow rejects are rewritten by `mlflow_key`. The run is
    marked finished on `close`.
    """

    def __init__(self, tracking_uri: str, experiment: str, run_name: str) -> None:
        require("mlflow")
        from mlflow.tracking import MlflowClient

        if _is_file_store(tracking_uri):
            # MLflow 3 refuses file stores unless opted in; a file store needs no
            # database packages (mlflow-skinny has none), so Temper opts in, unless
            # the user has set the variable themselves.
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client = MlflowClient(tracking_uri=tracking_uri)
        found = self.client.get_experiment_by_name(experiment)
        exp_id = found.experiment_id if found else self.client.create_experiment(experiment)
        self.run_id = self.client.create_run(exp_id, run_name=run_name).info.run_id

    def write(self, record: dict[str, Any]) -> None:
        from mlflow.entities import Metric

        step, now_ms = int(record.get("step", 0)), int(time.time() * 1000)
        metrics = [
            Metric(mlflow_key(k), v, now_ms, step) for k, v in numeric_scalars(record).items()
        ]
        if metrics:
            self.client.log_batch(self.run_id, metrics=metrics)

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


__all__ = [
    "MlflowSink",
    "TensorBoardSink",
    "WandbSink",
    "check_sinks",
    "mlflow_key",
]
