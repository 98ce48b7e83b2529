"""A tiny run with a TensorBoard sink and `--profile`: event files and a Chrome trace.

One run serves both tests (module fixture): the sink must get every step's
scalars under their metric names, and the trace must hold the loop's stage
spans and the torch ops the compute thread ran inside them.
"""

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from temper.cli.main import main

STAGES = ["temper/step", "temper/generate", "temper/reward", "temper/train", "temper/weight_sync"]


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    pytest.importorskip("tensorboard")
    root = tmp_path_factory.mktemp("runs")
    args = [
        "train",
        f"--run.output_dir={root}",
        "--run.name=tb",
        "--profile",
        '--log.sinks=["tensorboard"]',
        "--orchestrator.steps=2",
        "--orchestrator.prompts_per_step=2",
        "--orchestrator.group_size=4",
        "--orchestrator.max_response_tokens=16",
        "--orchestrator.drop_zero_variance_groups=false",
        "--eval.at_start=false",
        "--eval.every=0",
        "--eval.size=4",
        "--log.progress=false",
        "--checkpoint.at_end=false",
    ]
    assert main(args) == 0
    return root / "tb"


def test_tensorboard_sink_gets_every_step_of_a_run(run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    acc = EventAccumulator(str(run / "tensorboard"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"reward_mean", "loss", "time_step_s", "policy_version", "eval/accuracy"} <= tags
    for key in ("reward_mean", "loss", "policy_version"):
        got = [(e.step, e.value) for e in acc.Scalars(key)]
        assert got == [(m["step"], pytest.approx(m[key])) for m in metrics], key
    # The final eval goes to the sinks (not to metrics.jsonl) under eval/.
    final = json.loads((run / "eval" / "step_000002.json").read_text())
    [(step, value)] = [(e.step, e.value) for e in acc.Scalars("eval/accuracy")]
    assert step == 2 and value == pytest.approx(final["accuracy"])
    assert all(not k.startswith("eval/") for m in metrics for k in m)


def _spans(events: list[dict], name: str) -> list[dict]:
    return [e for e in events if e.get("ph") == "X" and e.get("name") == name]


def test_profile_writes_a_chrome_trace_with_stages_and_compute_thread_ops(run):
    [trace_path] = (run / "profile").glob("*.trace.json")
    assert trace_path.name == "step_000001.trace.json"
    events = json.loads(trace_path.read_text())["traceEvents"]
    for name in STAGES:
        assert len(_spans(events, name)) == 1, name
    [train] = _spans(events, "temper/train")
    [generate] = _spans(events, "temper/generate")
    aten = [e for e in events if e.get("ph") == "X" and str(e.get("name")).startswith("aten::")]

    def inside(span: dict) -> list[dict]:
        end = span["ts"] + span["dur"]
        return [e for e in aten if span["ts"] <= e["ts"] <= end and e["tid"] != span["tid"]]

    # The spans open on the event-loop thread; the torch work runs on the compute thread.
    assert any(e["name"] == "aten::mm" or e["name"] == "aten::addmm" for e in inside(train))
    assert inside(generate)
    assert any("backward" in str(e.get("name")).lower() for e in events)
    recorded = [json.loads(x) for x in (run / "events.jsonl").read_text().splitlines()]
    [note] = [e for e in recorded if e["kind"] == "profile"]
    assert note["step"] == 1 and note["all_threads"] is True
    assert Path(note["path"]) == trace_path


@pytest.mark.parametrize(
    ("extra", "expected"),
    [([], None), (["--profile"], 1), (["--profile", "--log.profile_step=3"], 3)],
)
def test_profile_flag_sets_step_one_unless_a_step_is_configured(
    monkeypatch, tmp_path, extra, expected
):
    seen = []

    class FakeOrchestrator:
        # Neither stopped by a health check nor interrupted.
        guard = SimpleNamespace(stop_reason=None, interrupted_at=None)

        def __init__(self, cfg):
            seen.append(cfg.log.profile_step)

        async def run(self):
            return {}

        async def close(self):
            pass

    monkeypatch.setattr("temper.orchestrator.loop.Orchestrator", FakeOrchestrator)
    assert main(["train", f"--run.output_dir={tmp_path}", *extra]) == 0
    assert seen == [expected]


def test_the_eval_line_names_each_metric_once():
    from temper.orchestrator.loop import _eval_line

    one = _eval_line(3, {"accuracy": 0.0, "pass@1": 0.025, "k": 1, "mean@1": 0.025})
    assert one == "eval step 3:  accuracy 0.000  pass@1 0.025  mean@1 0.025"
    four = _eval_line(3, {"accuracy": 0.5, "pass@1": 0.4, "k": 4, "pass@4": 0.7, "mean@4": 0.4})
    assert four.count("pass@1") == 1 and "pass@4 0.700" in four
