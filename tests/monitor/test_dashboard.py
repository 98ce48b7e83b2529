"""The dashboard's JSON API (no browser) over run directories written by the real writers.

`make_runs` writes two runs the way `temper train` does (RunDir, JsonlSink,
Trajectory records, token ids from the tiny model's tokenizer): "demo", a
single-turn arithmetic run, and "tools", a multi-turn tool-use run whose one
record carries per-token `trainer_logprobs`. The browser tests reuse it.
"""

from __future__ import annotations

import json
import math
import shutil
import socket
from pathlib import Path
from typing import Any

import httpx
import pytest
from raw_http import raw_get
from tokenizers import Tokenizer

import temper
from temper.config import load_config
from temper.monitor.dashboard import DashboardServer
from temper.monitor.sinks import JsonlSink, read_jsonl, truncate_jsonl_after_step
from temper.orchestrator.run_dir import RunDir
from temper.records import Trajectory

TINY_TOKENIZER = Path(temper.__file__).parent / "models" / "tiny" / "tokenizer.json"
IM_END = "<|im_end|>"
TOOL_CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "17*3"}}</tool_call>'


def _ids(tok: Tokenizer, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False).ids


def step_metrics(step: int, shift: float = 0.0) -> dict[str, Any]:
    """A metrics.jsonl record with the keys `orchestrator.sync` writes."""
    gen, rew, train, sync = 3.0 / step, 0.2 + shift, 5.0 + 0.1 * step, 0.01
    return {
        "step": step,
        "reward_mean": 0.5 + 0.05 * step - shift,
        "accuracy": 0.5 + 0.05 * step - shift,
        "loss": -0.3 / step + shift,
        "entropy": 0.12 + 0.001 * step,
        "response_len_mean": 12.0 - step / 3 + 10 * shift,
        "reward/math_verify": 0.5 + 0.05 * step - shift,
        "train_infer_logprob_diff": 1e-6 * step,
        "grad_norm": math.nan if step == 2 else 0.5,  # NaN: the sink writes null
        "policy_version": step,
        "time_generate_s": gen,
        "time_reward_s": rew,
        "time_train_s": train,
        "time_weight_sync_s": sync,
        "time_step_s": gen + rew + train + sync + 0.05,
    }


def _single_turn(tok: Tokenizer, step: int, i: int) -> Trajectory:
    a, b = 10 + i, 30 + step
    prompt = f"<|im_start|>user\nWhat is {a} + {b}?{IM_END}\n<|im_start|>assistant\n"
    answer = a + b if i % 2 == 0 else a + b + 1
    text = f"{a % 10}+{b % 10}. \\boxed{{{answer}}}"
    response = _ids(tok, text + IM_END)
    correct = answer == a + b
    return Trajectory(
        task_id=f"arith-l{1 + i % 2}-{a}+{b}",
        group_id=i // 2,
        prompt_ids=_ids(tok, prompt),
        response_ids=response,
        loss_mask=[1] * len(response),
        behaviour_logprobs=[-0.01 * (k + 1) for k in range(len(response))],
        versions=[step - 1] * len(response),
        finish_reason="stop",
        prompt_text=prompt,
        response_text=text,
        category=f"level{1 + i % 2}",
        reward=1.0 if correct else 0.0,
        reward_components={"math_verify": 1.0 if correct else 0.0},
        correct=correct,
        advantage=0.7 if correct else -0.7,
    )


def _episode(tok: Tokenizer, step: int, i: int) -> dict[str, Any]:
    """A tool-use episode: call, observation (mask 0), answer; as a JSON record."""
    turn1 = _ids(tok, TOOL_CALL + IM_END)
    obs = _ids(tok, f"\n<|im_start|>user\n<tool_response>\n51\n</tool_response>{IM_END}\n")
    obs += _ids(tok, "<|im_start|>assistant\n")
    turn2 = _ids(tok, "\\boxed{51}" + IM_END)
    ids = turn1 + obs + turn2
    mask = [1] * len(turn1) + [0] * len(obs) + [1] * len(turn2)
    behaviour = [-0.05 * (k % 7) if m else 0.0 for k, m in enumerate(mask)]
    reward = 1.0 if i % 2 == 0 else 0.0
    traj = Trajectory(
        task_id=f"calc-{step}-{i}",
        group_id=i // 2,
        prompt_ids=_ids(
            tok, "<|im_start|>user\nWhat is 17 * 3?<|im_end|>\n<|im_start|>assistant\n"
        ),
        response_ids=ids,
        loss_mask=mask,
        behaviour_logprobs=behaviour,
        versions=[step - 1 if m else -1 for m in mask],
        finish_reason="done",
        category="calculator" if i < 2 else "lookup",
        reward=reward,
        correct=reward > 0,
        advantage=0.5 if reward else -0.5,
        num_turns=2,
        turn_spans=[(0, len(turn1)), (len(turn1) + len(obs), len(ids))],
        turn_rewards=[0.0, reward],
        messages=[
            {"role": "system", "content": "You can call tools."},
            {"role": "user", "content": "What is 17 * 3?"},
            {"role": "assistant", "content": TOOL_CALL},
            {"role": "tool", "name": "calculator", "content": "51"},
            {"role": "assistant", "content": "\\boxed{51}"},
        ],
    )
    record = traj.to_json()
    if i == 0:  # one record with the trainer's per-token logprobs: the mismatch view
        record["trainer_logprobs"] = [
            b - 0.01 * (k % 3 + 1) if m else 0.0
            for k, (b, m) in enumerate(zip(behaviour, mask, strict=True))
        ]
    return record


def make_runs(root: Path) -> Path:
    """Write runs "demo" (single-turn, 4 steps) and "tools" (multi-turn, 3 steps) under root."""
    tok = Tokenizer.from_file(str(TINY_TOKENIZER))
    for name, steps in (("demo", 4), ("tools", 3)):
        cfg = load_config(None, [f"run.output_dir={json.dumps(str(root))}", f"run.name={name}"])
        run = RunDir.prepare(cfg)
        metrics, events = JsonlSink(run.metrics), JsonlSink(run.events)
        run.write_eval(0, {"accuracy": 0.4, "pass@1": 0.45, "k": 4})
        for step in range(1, steps + 1):
            metrics.write(step_metrics(step, shift=0.0 if name == "demo" else 0.1))
            if name == "demo":
                run.write_trajectories(step, [_single_turn(tok, step, i) for i in range(4)])
            else:
                lines = [json.dumps(_episode(tok, step, i)) for i in range(4)]
                (run.trajectories / f"step_{step:06d}.jsonl").write_text("\n".join(lines) + "\n")
        run.write_eval(steps, {"accuracy": 0.6, "pass@1": math.nan, "k": 4})
        events.write({"step": 2, "kind": "reward_errors", "count": 1})
        events.write(
            {"step": 3, "kind": "entropy_collapse", "level": "warning", "message": "entropy fell"}
        )
        metrics.close()
        events.close()
        # Real checkpoints hold the tokenizer: the dashboard decodes tokens with it.
        ckpt = run.checkpoints / f"step_{steps}"
        ckpt.mkdir(parents=True)
        shutil.copy(TINY_TOKENIZER, ckpt / "tokenizer.json")
    return root


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    return make_runs(tmp_path_factory.mktemp("runs"))


@pytest.fixture(scope="module")
def server(runs):
    with DashboardServer(runs) as srv:
        yield srv


@pytest.fixture
def client(server):
    with httpx.Client(base_url=server.url, timeout=30) as c:
        yield c


def test_lists_runs_with_step_counts(client):
    body = client.get("/api/runs").json()
    assert [(r["name"], r["steps"], r["last_step"], r["events"]) for r in body["runs"]] == [
        ("demo", 4, 4, 2),
        ("tools", 3, 3, 2),
    ]


@pytest.mark.parametrize("name", ["demo", "tools"])
def test_metrics_equal_metrics_jsonl(client, runs, name):
    expected = read_jsonl(runs / name / "metrics.jsonl")
    body = client.get(f"/api/runs/{name}/metrics").json()
    assert body["records"] == expected
    assert body["next"] == len(expected) and body["reset"] is False
    assert body["records"][1]["grad_norm"] is None  # NaN was logged as null
    later = client.get(f"/api/runs/{name}/metrics", params={"since": 2}).json()
    assert later["records"] == expected[2:]


def test_run_summary(client):
    body = client.get("/api/runs/demo").json()
    assert body["steps"] == 4 and body["last_step"] == 4
    assert {"reward_mean", "time_train_s", "reward/math_verify", "grad_norm"} <= set(
        body["metrics"]
    )
    assert "step" not in body["metrics"]
    assert body["trajectory_steps"] == [1, 2, 3, 4]
    assert body["eval_steps"] == [0, 4]
    assert client.get("/api/runs/demo/steps").json()["steps"][0] == {"step": 1, "samples": 4}


def test_evals_and_events(client, runs):
    evals = client.get("/api/runs/demo/evals").json()["evals"]
    assert [e["step"] for e in evals] == [0, 4]
    assert evals[1]["pass@1"] is None  # NaN in the eval file is sent as null, not a 500
    events = client.get("/api/runs/demo/events").json()
    written = read_jsonl(runs / "demo" / "events.jsonl")
    # The file's records, each with a level: its own, else derived from its kind.
    assert events["records"] == [{"level": "warning", **r} for r in written]
    assert client.get("/api/runs/demo/events", params={"since": 1}).json()["records"][0][
        "kind"
    ] == ("entropy_collapse")


def _run_with_events(root: Path, name: str, events: list[dict], finished: bool = False) -> None:
    run = root / name
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text(json.dumps(step_metrics(1)) + "\n")
    (run / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    if finished:
        (run / "report.html").write_text("<html></html>")


STOP_ALERT = {"step": 1, "kind": "alert", "check": "nan", "message": "loss is NaN",
              "action": "stop", "value": float("nan")}  # fmt: skip


def test_runs_have_a_status_and_events_a_level(tmp_path):
    _run_with_events(
        tmp_path, "crashed", [STOP_ALERT, {"step": 1, "kind": "stopped_by_health_check"}]
    )
    _run_with_events(tmp_path, "done", [{**STOP_ALERT, "action": "warn"}], finished=True)
    _run_with_events(tmp_path, "live", [{"step": 1, "kind": "time_budget_reached"}])
    with DashboardServer(tmp_path) as srv, httpx.Client(base_url=srv.url, timeout=30) as c:
        runs = {r["name"]: r["status"] for r in c.get("/api/runs").json()["runs"]}
        assert runs == {"crashed": "failed", "done": "finished", "live": "running"}
        levels = {
            name: [e["level"] for e in c.get(f"/api/runs/{name}/events").json()["records"]]
            for name in runs
        }
    assert levels == {"crashed": ["error", "error"], "done": ["warning"], "live": ["info"]}


def test_live_update_appended_line_is_served(tmp_path):
    root = make_runs(tmp_path)
    path = root / "demo" / "metrics.jsonl"
    with DashboardServer(root) as srv, httpx.Client(base_url=srv.url) as c:
        first = c.get("/api/runs/demo/metrics").json()
        assert first["next"] == 4
        sink = JsonlSink(path)
        sink.write(step_metrics(5))
        new = c.get("/api/runs/demo/metrics", params={"since": first["next"]}).json()
        assert new["records"] == [read_jsonl(path)[-1]] and new["records"][0]["step"] == 5
        assert new["next"] == 5
        # A line still being written (no newline yet) waits for the next poll.
        with open(path, "a") as f:
            f.write('{"step": 6, "reward_mean"')
        assert c.get("/api/runs/demo/metrics", params={"since": 5}).json()["records"] == []
        with open(path, "a") as f:
            f.write(": 0.9}\n")
        assert c.get("/api/runs/demo/metrics", params={"since": 5}).json()["records"] == [
            {"step": 6, "reward_mean": 0.9}
        ]
        assert c.get("/api/runs").json()["runs"][0]["steps"] == 6
        # A resumed run truncates past its checkpoint: the client is told to start over.
        sink.close()
        truncate_jsonl_after_step(path, 3)
        again = c.get("/api/runs/demo/metrics", params={"since": 6}).json()
        assert again["reset"] is True and again["next"] == 3
        assert again["records"] == read_jsonl(path)


def test_single_turn_sample_view(client, runs):
    body = client.get("/api/runs/demo/trajectories/2").json()
    records = read_jsonl(runs / "demo" / "trajectories" / "step_000002.jsonl")
    assert body["total"] == 4 and body["categories"] == ["level1", "level2"]
    assert body["reward_range"] == [0.0, 1.0] and body["decode_error"] is None
    s, rec = body["samples"][0], records[0]
    assert [t["role"] for t in s["turns"]] == ["prompt", "assistant"]
    assert s["turns"][0]["content"] == rec["prompt_text"]
    assert s["turns"][1]["content"] == rec["response_text"] and s["turns"][1]["reward"] == 1.0
    tokens = s["tokens"]
    assert tokens["ids"] == rec["response_ids"]
    assert "".join(tokens["text"]) == rec["response_text"] + IM_END
    assert tokens["fields"]["behaviour_logprob"] == rec["behaviour_logprobs"]
    assert tokens["fields"]["advantage"] == [rec["advantage"]] * len(rec["response_ids"])
    assert set(tokens["fields"]["staleness"]) == {0}  # step 2 trains on version-1 tokens
    assert "trainer_logprobs" in s["missing_fields"]["mismatch"]
    assert "mismatch" not in tokens["fields"]


def test_multi_turn_sample_view(client, runs):
    body = client.get("/api/runs/tools/trajectories/1").json()
    rec = read_jsonl(runs / "tools" / "trajectories" / "step_000001.jsonl")[0]
    s = body["samples"][0]
    assert [t["role"] for t in s["turns"]] == ["system", "user", "assistant", "tool", "assistant"]
    call = s["turns"][2]
    assert call["tool_calls"] == [{"name": "calculator", "arguments": {"expression": "17*3"}}]
    assert (call["reward"], s["turns"][4]["reward"]) == (0.0, 1.0)
    assert s["turns"][3]["name"] == "calculator"
    tokens = s["tokens"]
    assert tokens["mask"] == rec["loss_mask"]
    (a0, a1), (b0, b1) = rec["turn_spans"]
    assert tokens["turn"][a0:a1] == [0] * (a1 - a0) and tokens["turn"][b0:b1] == [1] * (b1 - b0)
    assert set(tokens["turn"][a1:b0]) == {-1}
    # Observation tokens carry no policy values.
    assert set(tokens["fields"]["behaviour_logprob"][a1:b0]) == {None}
    mismatch = tokens["fields"]["mismatch"]
    expected = [-0.01 * (k % 3 + 1) for k in range(a0, a1)]
    assert all(abs(m - e) < 1e-9 for m, e in zip(mismatch[a0:a1], expected, strict=True))
    assert s["missing_fields"] == {}
    assert "mismatch" in body["samples"][1]["missing_fields"]  # that record has no trainer_logprobs


def test_trajectory_filters(client):
    url = "/api/runs/tools/trajectories/2"
    assert [s["reward"] for s in client.get(url, params={"min_reward": 0.5}).json()["samples"]] == [
        1.0,
        1.0,
    ]
    assert len(client.get(url, params={"max_reward": 0.5}).json()["samples"]) == 2
    lookup = client.get(url, params={"category": "lookup"}).json()
    assert {s["category"] for s in lookup["samples"]} == {"lookup"} and lookup["total"] == 4
    wrong = client.get(url, params={"correct": "false", "category": "calculator"}).json()
    assert [s["index"] for s in wrong["samples"]] == [1]
    assert "text" not in client.get(url, params={"decode": "false"}).json()["samples"][0]["tokens"]
    page = client.get(url, params={"offset": 1, "limit": 2, "min_reward": 0.5}).json()
    assert [s["index"] for s in page["samples"]] == [2]
    assert (page["matched"], page["total"], page["offset"]) == (2, 4, 1)


def test_other_host_names_are_refused(server):
    """Bound to 127.0.0.1, only loopback Host headers: no reading runs via DNS rebinding."""
    assert httpx.get(f"{server.url}/api/runs", headers={"Host": "evil.example"}).status_code == 400
    ok = httpx.get(f"http://localhost:{server.port}/api/runs")
    assert ok.status_code == 200


def _raw_get(server, path: str) -> tuple[int, str]:
    return raw_get(server.port, path)


@pytest.mark.parametrize(
    "path",
    [
        "/api/runs/%2e%2e/metrics",
        "/api/runs/..%2F..%2Fetc/metrics",
        "/api/runs/%2Fetc%2Fpasswd/metrics",
        "/api/runs/..%5C..%5Cetc/metrics",
        "/api/runs/.hidden/metrics",
        "/api/runs/../../etc/passwd",
        "/api/runs/demo%2F..%2F..%2Fetc/trajectories/1",
        "/static/../server.py",
        "/static/%2e%2e/server.py",
    ],
)
def test_path_traversal_rejected(server, path):
    status, body = _raw_get(server, path)
    assert status in (400, 404), (path, status, body)
    assert "root:" not in body and "import " not in body  # neither /etc/passwd nor source
    detail = json.loads(body)["detail"]
    assert isinstance(detail, str) and detail
    encoded = any(x in path for x in ("%2e%2e", "%2F", "%5C", ".hidden"))
    if path.startswith("/api/") and encoded:
        assert status == 400 and "run name" in detail


def test_missing_runs_and_steps_are_clear_404s(client):
    r = client.get("/api/runs/nope/metrics")
    assert r.status_code == 404 and "no run named 'nope'" in r.json()["detail"]
    r = client.get("/api/runs/demo/trajectories/99")
    assert r.status_code == 404 and "no trajectories for step 99" in r.json()["detail"]
    r = client.get("/api/nothing")
    assert r.status_code == 404 and "/api/nothing" in r.json()["detail"]


def test_page_and_static_files_need_no_internet(client):
    page = client.get("/")
    assert page.status_code == 200 and "/static/chart.js" in page.text
    static = Path(temper.__file__).parent / "monitor" / "dashboard" / "static"
    for name in ("index.html", "app.js", "chart.js", "trajectories.js", "style.css"):
        text = client.get(f"/static/{name}").text
        assert text == (static / name).read_text()
        # No CDN: the only URL allowed is the SVG namespace.
        assert "https://" not in text
        assert text.replace("http://www.w3.org/2000/svg", "").count("http://") == 0


def test_server_stops_and_frees_its_port(runs):
    srv = DashboardServer(runs)
    url = srv.start()
    assert httpx.get(f"{url}/api/runs").status_code == 200
    srv.stop()
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{url}/api/runs", timeout=2)


def test_cli_dash_reports_a_busy_port(runs, capsys):
    from temper.cli.main import main

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        code = main(["dash", str(runs), "--port", str(busy.getsockname()[1])])
    assert code == 2
    assert "cannot listen on 127.0.0.1" in capsys.readouterr().err
    assert main(["dash", str(runs), "--trainer.lr=1"]) == 2


@pytest.mark.slow
def test_api_over_a_real_training_run(tmp_path):
    """`temper train` for 2 steps, then the API serves exactly what it wrote."""
    from temper.cli.main import main

    code = main(
        [
            "train",
            "--orchestrator.steps=2",
            "--eval.every=0",
            "--eval.size=8",
            "--log.progress=false",
            f"--run.output_dir={tmp_path}",
            "--run.name=real",
        ]
    )
    assert code == 0
    with DashboardServer(tmp_path) as srv, httpx.Client(base_url=srv.url, timeout=30) as c:
        body = c.get("/api/runs/real/metrics").json()
        assert body["records"] == read_jsonl(tmp_path / "real" / "metrics.jsonl")
        assert [r["step"] for r in body["records"]] == [1, 2]
        traj = c.get("/api/runs/real/trajectories/2").json()
        rec = read_jsonl(tmp_path / "real" / "trajectories" / "step_000002.jsonl")[0]
        sample = traj["samples"][0]
        assert sample["tokens"]["ids"] == rec["response_ids"]
        assert "".join(sample["tokens"]["text"]).startswith(rec["response_text"])


def test_token_view_shows_per_token_advantages_of_turn_credit():
    from temper.monitor.dashboard.samples import token_fields

    traj = Trajectory(
        task_id="game", group_id=0, prompt_ids=[1], response_ids=[5, 6, 7, 8, 9],
        loss_mask=[1, 1, 0, 1, 0], behaviour_logprobs=[-0.5] * 5, versions=[0] * 5,
        finish_reason="done", advantage=0.25, turn_spans=[(0, 2), (3, 4)],
        token_advantages=[0.25, 0.25, 0.0, -1.5, 0.0],
    )  # fmt: skip
    record = json.loads(json.dumps(traj.to_json()))  # as written to trajectories/step_N.jsonl
    fields = token_fields(record, 1)["tokens"]["fields"]
    assert fields["advantage"] == [0.25, 0.25, None, -1.5, None]
