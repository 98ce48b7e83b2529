"""TensorBoard, W&B and MLflow sinks: each writes real files that read back as written.

Also: the fan-out (JSONL plus extras; a failing extra is dropped, not fatal),
which values count as scalars, and the one-line error for a missing package.
"""

import json
import math
import sys
import time
from pathlib import Path

import pytest

from temper.builder.sinks import build_sinks
from temper.cli.main import main
from temper.config.schema import LogConfig
from temper.errors import ConfigError
from temper.monitor.external_sinks import (
    MlflowSink,
    TensorBoardSink,
    WandbSink,
    check_sinks,
    mlflow_key,
)
from temper.monitor.sinks import FanOutSink, JsonlSink, numeric_scalars, read_jsonl

RECORDS = [
    {"step": 1, "loss": 0.5, "reward/format": 1.0, "groups_kept": 2, "note": "skipped"},
    {"step": 2, "loss": 0.25, "reward/format": 0.0, "groups_kept": 3, "extra": {"a": 1}},
]


def test_numeric_scalars_keeps_numbers_and_drops_the_rest():
    record = {"step": 3, "a": 1, "b": 2.5, "ok": True, "s": "x", "n": None, "d": {"x": 1}}
    assert numeric_scalars(record) == {"a": 1.0, "b": 2.5, "ok": 1.0}
    assert math.isnan(numeric_scalars({"x": math.nan})["x"])


def test_tensorboard_sink_writes_event_files_that_read_back(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    sink = TensorBoardSink(tmp_path / "tb")
    for r in RECORDS:
        sink.write(r)
    sink.close()
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    assert set(acc.Tags()["scalars"]) == {"loss", "reward/format", "groups_kept"}
    assert [(e.step, e.value) for e in acc.Scalars("loss")] == [(1, 0.5), (2, 0.25)]
    assert [(e.step, e.value) for e in acc.Scalars("groups_kept")] == [(1, 2.0), (2, 3.0)]


def test_tensorboard_sink_on_resume_drops_points_past_the_checkpoint(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    first = TensorBoardSink(tmp_path / "tb")
    for step in (1, 2, 3):  # the process died after step 3; the checkpoint was step 2
        first.write({"step": step, "loss": float(step)})
    first.close()
    resumed = TensorBoardSink(tmp_path / "tb", purge_step=3)
    for step in (3, 4):
        resumed.write({"step": step, "loss": 10.0 * step})
    resumed.close()
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    got = [(e.step, e.value) for e in acc.Scalars("loss")]
    assert got == [(1, 1.0), (2, 2.0), (3, 30.0), (4, 40.0)]


def _wandb_records(path: Path) -> list:
    """Parse a .wandb file: a 7-byte header, then LevelDB-log framed protobuf Records."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, block, buf, out = 7, 32 * 1024, b"", []
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        length, kind = int.from_bytes(data[pos + 4 : pos + 6], "little"), data[pos + 6]
        if pos + 7 + length > len(data):  # a record still being written
            break
        payload = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind == 0:
            continue
        buf = payload if kind in (1, 2) else buf + payload  # 1 full, 2 first, 3 middle, 4 last
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(buf)
            out.append(record)
    return out


def _wandb_records_once_flushed(path: Path, timeout_s: float = 30.0) -> list:
    """The file's records once wandb-core has flushed the run and both history steps.

    ``run.finish()`` can return before the service's writer flushes its buffer
    (seen once in CI under load: a file with a header and no run record); the
    service flushes at the latest when the process exits, so a reader in the
    same process waits for it.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        records = _wandb_records(path)
        kinds = [r.WhichOneof("record_type") for r in records]
        if ("run" in kinds and kinds.count("history") >= 2) or time.monotonic() > deadline:
            return records
        time.sleep(0.2)


def test_wandb_offline_sink_writes_a_run_file_with_the_metrics(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wb"))
    (tmp_path / "wb").mkdir()
    sink = WandbSink(tmp_path / "unused", "temper-test", "demo", config={"algo": {"lr": 1e-3}})
    for r in RECORDS:
        sink.write(r)
    sink.close()
    assert not (tmp_path / "unused").exists()  # WANDB_DIR wins over the run directory
    [run_file] = (tmp_path / "wb" / "wandb").glob("offline-run-*/run-*.wandb")
    records = _wandb_records_once_flushed(run_file)
    [run] = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert run.project == "temper-test" and run.display_name == "demo"
    config = {u.key: json.loads(u.value_json) for u in run.config.update}
    assert config["algo"] == {"lr": 1e-3}
    history = {}
    for r in records:
        if r.WhichOneof("record_type") == "history":
            items = {
                i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item
            }
            history[r.history.step.num] = items
    assert sorted(history) == [1, 2]
    for r in RECORDS:
        got = history[r["step"]]
        assert {k: got[k] for k in ("loss", "reward/format", "groups_kept")} == {
            k: r[k] for k in ("loss", "reward/format", "groups_kept")
        }
        assert "note" not in got and "extra" not in got


def test_mlflow_sink_metrics_read_back_from_the_file_store(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)  # the sink opts in itself
    from mlflow.tracking import MlflowClient

    uri = (tmp_path / "mlruns").as_uri()
    sink = MlflowSink(uri, "temper-test", "demo")
    for r in RECORDS:
        sink.write(r)
    sink.write({"step": 2, "eval/pass@1": 0.75})
    sink.close()
    client = MlflowClient(tracking_uri=uri)
    run = client.get_run(sink.run_id)
    assert run.info.run_name == "demo" and run.info.status == "FINISHED"
    exp = client.get_experiment(run.info.experiment_id)
    assert exp.name == "temper-test"
    for key in ("loss", "reward/format", "groups_kept"):
        history = client.get_metric_history(sink.run_id, key)
        assert [(m.step, m.value) for m in history] == [(r["step"], r[key]) for r in RECORDS]
    [m] = client.get_metric_history(sink.run_id, "eval/pass_at_1")
    assert (m.step, m.value) == (2, 0.75)
    assert set(run.data.metrics) == {"loss", "reward/format", "groups_kept", "eval/pass_at_1"}


def test_mlflow_key_rewrites_only_illegal_characters():
    assert mlflow_key("pass@8") == "pass_at_8"
    assert mlflow_key("reward/format-x y.z:1") == "reward/format-x y.z:1"
    assert mlflow_key("a%b") == "a_b"


def test_build_sinks_defaults_put_files_under_the_run_dir(tmp_path, monkeypatch):
    pytest.importorskip("tensorboard")
    pytest.importorskip("mlflow")
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    log = LogConfig(sinks=["mlflow", "tensorboard", "mlflow"])
    sinks = build_sinks(log, tmp_path, "demo", config={})
    assert [type(s).__name__ for s in sinks] == ["MlflowSink", "TensorBoardSink"]
    for s in sinks:
        s.write({"step": 1, "loss": 1.0})
        s.close()
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert list((tmp_path / "mlruns").glob("*/*/metrics/loss"))


class _Broken:
    def write(self, record):
        raise OSError("disk gone")

    def close(self):
        raise AssertionError("a dropped sink is not closed again")


class _Memory:
    def __init__(self):
        self.records, self.closed = [], False

    def write(self, record):
        self.records.append(record)

    def close(self):
        self.closed = True


def test_fan_out_writes_everywhere_and_drops_a_failing_extra(tmp_path, capsys):
    memory = _Memory()
    fan = FanOutSink(JsonlSink(tmp_path / "m.jsonl"), [_Broken(), memory])
    fan.write({"step": 1, "loss": 1.0})
    fan.write({"step": 2, "loss": 0.5})
    fan.write_extras({"step": 2, "eval/accuracy": 0.5})
    fan.close()
    assert [r["step"] for r in read_jsonl(tmp_path / "m.jsonl")] == [1, 2]
    assert memory.records[-1] == {"step": 2, "eval/accuracy": 0.5} and len(memory.records) == 3
    assert memory.closed
    err = capsys.readouterr().err
    assert err.count("metric sink _Broken failed and is now off: disk gone") == 1


@pytest.mark.parametrize("sink", ["tensorboard", "wandb", "mlflow"])
def test_missing_package_is_one_line_naming_the_extra(monkeypatch, sink):
    monkeypatch.setitem(sys.modules, sink, None)  # makes `import <sink>` raise ImportError
    with pytest.raises(ConfigError) as err:
        check_sinks([sink])
    message = str(err.value)
    assert "\n" not in message
    assert f"'{sink}' package is not installed" in message
    assert f"pip install 'temper-rl[{sink}]'" in message


def test_cli_fails_before_any_work_when_a_sink_package_is_missing(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "wandb", None)
    code = main(["train", f"--run.output_dir={tmp_path}", '--log.sinks=["wandb"]'])
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "temper: error: log.sinks includes 'wandb' but the 'wandb' package is not installed: "
        "pip install 'temper-rl[wandb]'"
    )
    assert not (tmp_path / "demo").exists()  # failed before the run directory was made


def test_unknown_sink_and_profile_step_past_the_end_are_config_errors(tmp_path, capsys):
    assert main(["train", f"--run.output_dir={tmp_path}", '--log.sinks=["neptune"]']) == 2
    assert "log.sinks.0" in capsys.readouterr().err
    args = ["train", f"--run.output_dir={tmp_path}", "--orchestrator.steps=2"]
    assert main([*args, "--log.profile_step=3"]) == 2
    assert "log.profile_step=3 is past the last step" in capsys.readouterr().err
    assert not (tmp_path / "demo").exists()
