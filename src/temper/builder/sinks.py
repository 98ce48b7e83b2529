"""A run's metric sinks from ``log.sinks`` (`temper.monitor.sinks` has the protocol,
`temper.monitor.external_sinks` the TensorBoard, W&B and MLflow sinks)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from temper.config.schema import LogConfig
from temper.errors import ConfigError, TemperError
from temper.monitor.external_sinks import MlflowSink, TensorBoardSink, WandbSink
from temper.monitor.sinks import MetricSink


def build_sinks(
    log: LogConfig, run_dir: Path, run_name: str, config: dict[str, Any], start_step: int = 0
) -> list[MetricSink]:
    """The sinks named in ``log.sinks`` (a `LogConfig`), each started and ready to write.

    ``start_step`` is the step a resumed run continues from (0 for a new run).
    W&B and MLflow start a new run each time; TensorBoard keeps one folder.
    A sink that cannot start (W&B not logged in for online mode, a bad MLflow
    URI) raises a one-line ConfigError; sinks already started are closed first.
    """
    sinks: list[MetricSink] = []
    for name in dict.fromkeys(log.sinks):  # a name listed twice still gets one sink
        try:
            sinks.append(_make(name, log, run_dir, run_name, config, start_step))
        except Exception as err:
            for sink in sinks:
                sink.close()
            if isinstance(err, TemperError):
                raise
            detail = " ".join(str(err).split())
            raise ConfigError(f"log.sinks: {name} could not start: {detail}") from err
    return sinks


def _make(
    name: str, log: LogConfig, run_dir: Path, run_name: str, config: dict[str, Any], start_step: int
) -> MetricSink:
    if name == "tensorboard":
        return TensorBoardSink(run_dir / "tensorboard", start_step + 1 if start_step else None)
    if name == "wandb":
        return WandbSink(
            run_dir, log.wandb_project, run_name, log.wandb_mode, log.wandb_entity, config
        )
    uri = log.mlflow_tracking_uri or (run_dir / "mlruns").resolve().as_uri()
    return MlflowSink(uri, log.mlflow_experiment, run_name)
