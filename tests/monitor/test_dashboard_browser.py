"""The dashboard page in headless Chromium, driven over the Chrome DevTools Protocol.

No Playwright: Debian's `chromium` is driven over its websocket with the
`websockets` package (`cdp_browser.Browser`). Every test collects console
errors, uncaught exceptions and failed loads and fails on any. Screenshots go
to `$TEMPER_ARTIFACTS/screenshots/` (default `test-artifacts/screenshots/` in
the repository; gitignored).
"""

from __future__ import annotations

import math
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from temper.monitor.dashboard import DashboardServer
from temper.monitor.sinks import JsonlSink, read_jsonl

try:  # tests/monitor may or may not be a package
    from .test_dashboard import make_runs, step_metrics
except ImportError:
    from test_dashboard import make_runs, step_metrics

pytestmark = pytest.mark.browser

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytest.importorskip("websockets.sync.client", reason="browser tests need the websockets package")
if CHROMIUM is None:
    pytest.skip(
        "headless chromium is not installed (apt-get install chromium)", allow_module_level=True
    )

# After the skips: it needs websockets.
try:
    from .cdp_browser import Browser
except ImportError:
    from cdp_browser import Browser


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    return make_runs(tmp_path_factory.mktemp("browser-runs"))


@pytest.fixture(scope="module")
def server(runs):
    # Fast polling so the live-update test does not wait the default 3 s.
    with DashboardServer(runs, poll_ms=300) as srv:
        yield srv


@pytest.fixture(scope="module")
def browser():
    b = Browser(CHROMIUM)
    yield b
    b.close()


@pytest.fixture
def page(browser):
    """The browser, with errors from earlier tests cleared and checked after this one."""
    browser.errors.clear()
    try:
        yield browser
        assert browser.errors == [], browser.errors
    finally:
        # Leave the page even when the test failed: a page left polling its stopped
        # server would fail the next test with connection errors.
        browser.send("Page.navigate", url="about:blank")
        browser.wait_for("location.href === 'about:blank' && document.readyState === 'complete'")
        browser.errors.clear()


def _latest(b: Browser, run: str, metric: str) -> dict[str, Any] | None:
    return b.eval(
        f"""(() => {{ const e = document.querySelector(
              '.latest[data-run="{run}"][data-metric="{metric}"]');
           return e && {{text: e.textContent, value: e.dataset.value, step: e.dataset.step}}; }})()"""
    )


def test_metrics_page_charts_match_metrics_jsonl(page, server, runs):
    page.goto(f"{server.url}/#metrics")
    page.wait_for("document.querySelectorAll('.chart-card svg circle.pt').length > 0")
    cards = page.eval("[...document.querySelectorAll('.chart-card')].map(c => c.dataset.metric)")
    assert cards == ["reward_mean", "accuracy", "loss", "response_len_mean"]
    # One path per run in each chart, with one point per logged step.
    n = page.eval(
        "[...document.querySelectorAll('.chart-card[data-metric=loss] path.line')]"
        ".map(p => [p.dataset.run, Number(p.dataset.n)])"
    )
    assert n == [["demo", 4], ["tools", 3]]
    for run in ("demo", "tools"):
        last = read_jsonl(runs / run / "metrics.jsonl")[-1]
        for metric in ("reward_mean", "loss"):
            shown = _latest(page, run, metric)
            assert float(shown["value"]) == last[metric] and int(shown["step"]) == last["step"]
            assert math.isclose(float(shown["text"]), last[metric], rel_tol=1e-3)
    page.screenshot("metrics")


def test_metric_picker_adds_a_chart(page, server, runs):
    page.goto(f"{server.url}/?runs=demo#metrics")
    page.eval(
        "(() => { const s = document.getElementById('metric-select'); s.value = 'time_train_s';"
        " document.getElementById('add-chart').click(); })()"
    )
    page.wait_for("document.querySelector('.chart-card[data-metric=time_train_s] circle.pt')")
    shown = _latest(page, "demo", "time_train_s")
    assert float(shown["value"]) == read_jsonl(runs / "demo" / "metrics.jsonl")[-1]["time_train_s"]
    assert _latest(page, "tools", "time_train_s") is None  # only the ?runs= run is drawn
    # Eval results are metrics too: "eval:accuracy" from eval/step_N.json.
    keys = page.eval("[...document.querySelectorAll('#metric-select option')].map(o => o.value)")
    assert "eval:accuracy" in keys and "grad_norm" in keys
    # A NaN logged as null is a gap in the line, not a point.
    page.eval(
        "(() => { document.getElementById('metric-select').value = 'grad_norm';"
        " document.getElementById('add-chart').click(); })()"
    )
    page.wait_for("document.querySelector('.chart-card[data-metric=grad_norm] path.line')")
    logged = [r["grad_norm"] for r in read_jsonl(runs / "demo" / "metrics.jsonl")]
    drawn = page.eval("document.querySelector('.chart-card[data-metric=grad_norm] path').dataset.n")
    assert None in logged and int(drawn) == sum(v is not None for v in logged)


def test_run_picker_overlays_and_hides_runs(page, server):
    page.goto(f"{server.url}/#metrics")
    runs_in = "[...document.querySelectorAll('.chart-card[data-metric=reward_mean] path.line')].map(p => p.dataset.run).join()"
    assert page.wait_for(f"{runs_in} === 'demo,tools' && {runs_in}")
    page.eval("document.querySelector('.run-item[data-run=tools] input').click()")
    page.wait_for(f"{runs_in} === 'demo'")


def test_live_update_reaches_the_page(page, server, runs):
    page.goto(f"{server.url}/?runs=demo#metrics")
    sink = JsonlSink(runs / "demo" / "metrics.jsonl")
    record = {**step_metrics(5), "reward_mean": 0.123456}
    sink.write(record)
    sink.close()
    page.wait_for(
        "(e => e && e.dataset.step === '5')(document.querySelector("
        "'.latest[data-run=demo][data-metric=reward_mean]'))",
        timeout=10,
    )
    assert float(_latest(page, "demo", "reward_mean")["value"]) == 0.123456


def test_step_time_breakdown(page, server, runs):
    page.goto(f"{server.url}/?runs=demo#time")
    page.wait_for("document.querySelectorAll('#time-chart rect.bar').length > 0")
    steps = len(read_jsonl(runs / "demo" / "metrics.jsonl"))
    assert page.eval("document.querySelector('#time-chart svg').dataset.bars") == str(steps)
    stages = page.eval(
        "[...new Set([...document.querySelectorAll('#time-chart rect.bar')].map(r => r.dataset.stage))]"
    )
    assert {"generate", "reward", "train", "weight sync"} <= set(stages)
    last = read_jsonl(runs / "demo" / "metrics.jsonl")[-1]
    train = page.eval(
        "document.querySelector('#time-table tr[data-stage=train] td:nth-child(2)').textContent"
    )
    assert math.isclose(float(train), last["time_train_s"], rel_tol=1e-3)
    page.screenshot("step-time")


def test_alerts_table(page, server, runs):
    page.goto(f"{server.url}/#alerts")
    page.wait_for("document.querySelectorAll('#alerts-table tr.alert').length > 0")
    rows = page.eval(
        "[...document.querySelectorAll('#alerts-table tr.alert')].map(r => r.textContent)"
    )
    assert len(rows) == 4  # two events in each run
    assert any("entropy_collapse" in r and "entropy fell" in r for r in rows)
    assert page.eval("document.getElementById('alert-count').textContent") == "4"
    # Every row has a level: entropy_collapse its own, reward_errors one derived from its kind.
    levels = page.eval(
        "[...document.querySelectorAll('#alerts-table tr.alert td:nth-child(4)')]"
        ".map(td => td.textContent)"
    )
    assert levels == ["warning"] * 4
    assert page.eval("document.querySelectorAll('#alerts-table tr.level-warning').length") == 4
    page.screenshot("alerts")


def test_failed_runs_are_not_selected_and_every_run_has_its_own_colour(page, tmp_path):
    for i in range(30):
        run = tmp_path / f"run{i:02d}"
        run.mkdir()
        JsonlSink(run / "metrics.jsonl").write(step_metrics(1, shift=i / 100))
        if i % 10 == 3:  # stopped by a health check
            event = {"step": 1, "kind": "alert", "check": "nan", "action": "stop", "value": 0.0}
            JsonlSink(run / "events.jsonl").write(event)
    failed = {f"run{i:02d}" for i in (3, 13, 23)}
    with DashboardServer(tmp_path, poll_ms=300) as srv:
        page.goto(f"{srv.url}/#metrics")
        page.wait_for("document.querySelectorAll('.run-item').length === 30")
        checked = page.eval(
            "[...document.querySelectorAll('.run-item')]"
            ".filter(l => l.querySelector('input').checked).map(l => l.dataset.run)"
        )
        assert set(checked) == {f"run{i:02d}" for i in range(30)} - failed
        marked = page.eval(
            "[...document.querySelectorAll('.run-item')]"
            ".filter(l => l.querySelector('.status-failed')).map(l => l.dataset.run)"
        )
        assert set(marked) == failed
        # The colour each swatch is drawn with, as the browser computed it.
        colours = page.eval(
            "[...document.querySelectorAll('.run-item .swatch')]"
            ".map(s => getComputedStyle(s).backgroundColor)"
        )
        assert len(colours) == 30 and len(set(colours)) == 30
        page.screenshot("thirty-runs")
        # Leave the page before this server goes away, so it stops polling it.
        page.send("Page.navigate", url="about:blank")
        page.wait_for("location.href === 'about:blank' && document.readyState === 'complete'")


def test_trajectory_browser_single_turn(page, server, runs):
    page.goto(f"{server.url}/?runs=demo#trajectories")
    page.wait_for("document.querySelectorAll('.heatmap span.tok').length > 0")
    last = sorted((runs / "demo" / "trajectories").glob("step_*.jsonl"))[-1]
    rec = read_jsonl(last)[0]
    assert page.eval("document.getElementById('traj-step').value") == str(int(last.stem[5:]))
    assert page.eval("document.querySelectorAll('#sample-list li').length") == 4
    assert (
        page.eval("document.querySelector('.turn.assistant pre').textContent")
        == rec["response_text"]
    )
    assert (
        float(page.eval("document.querySelector('.sample-reward').dataset.value")) == rec["reward"]
    )
    tokens = page.eval(
        "[...document.querySelectorAll('.heatmap span.tok')].map(s => s.textContent)"
    )
    assert len(tokens) == len(rec["response_ids"]) and "".join(tokens).startswith(
        rec["response_text"]
    )
    coloured = page.eval(
        "[...document.querySelectorAll('.heatmap span.tok')].filter(s => s.style.background).length"
    )
    assert coloured == len(rec["response_ids"])  # every token is a policy token here
    assert page.eval("document.querySelectorAll('#sample-detail img').length") == 0  # text only
    page.screenshot("trajectories-demo")
    # The mismatch map says why it is empty on a run that does not record trainer_logprobs.
    page.eval(
        "(s => { s.value = 'mismatch'; s.dispatchEvent(new Event('change')); })(document.getElementById('traj-field'))"
    )
    assert "trainer_logprobs" in page.wait_for(
        "(document.querySelector('#sample-detail .note') || {}).textContent"
    )


def test_trajectory_browser_multi_turn_filters_and_mismatch(page, server, runs):
    page.goto(f"{server.url}/?runs=tools#trajectories")
    page.wait_for("document.querySelectorAll('.heatmap span.tok').length > 0")
    roles = page.eval("[...document.querySelectorAll('.turn')].map(t => t.classList[1])")
    assert roles == ["system", "user", "assistant", "tool", "assistant"]
    assert "calculator" in page.eval("document.querySelector('.tool-call').textContent")
    obs = page.eval("document.querySelectorAll('.heatmap span.tok.obs').length")
    rec = read_jsonl(runs / "tools" / "trajectories" / "step_000003.jsonl")[0]
    assert obs == rec["loss_mask"].count(0)
    assert page.eval("document.querySelectorAll('#sample-detail img').length") == 0  # text only
    page.eval(
        "(s => { s.value = 'mismatch'; s.dispatchEvent(new Event('change')); })(document.getElementById('traj-field'))"
    )
    page.wait_for("document.querySelector('.heatmap').dataset.field === 'mismatch'")
    assert page.eval("document.querySelectorAll('#sample-detail .note').length") == 0
    page.screenshot("trajectories-tools-mismatch")
    # Filter: category "lookup" keeps samples 2 and 3 only.
    page.eval(
        "(s => { s.value = 'lookup'; s.dispatchEvent(new Event('change')); })(document.getElementById('traj-category'))"
    )
    page.wait_for(
        "[...document.querySelectorAll('#sample-list li')].map(l => l.dataset.index).join() === '2,3'"
    )
    page.eval(
        "(s => { s.value = '0.5'; s.dispatchEvent(new Event('change')); })(document.getElementById('traj-min'))"
    )
    page.wait_for(
        "[...document.querySelectorAll('#sample-list li')].map(l => l.dataset.index).join() === '2'"
    )


_LOADED = "[...document.querySelectorAll('{0}')].every(i => i.complete && i.naturalWidth > 0)"


def _images(page: Browser, selector: str) -> list[dict[str, Any]]:
    """The <img> elements under `selector`: hash, natural and drawn width, loaded or not."""
    return page.eval(
        f"[...document.querySelectorAll('{selector}')].map(i => ({{sha: i.dataset.sha256,"
        " natural: i.naturalWidth, shown: i.getBoundingClientRect().width, done: i.complete,"
        " src: i.getAttribute('src'), link: i.parentElement.getAttribute('href')}))"
    )


def test_trajectory_browser_shows_images_inline(page, vision_runs):
    """Prompt pictures (single-turn) and observation pictures (multi-turn) load in their
    turns, and an observation's 16 image tokens are one picture in the token view."""
    with DashboardServer(vision_runs, poll_ms=300) as srv:
        page.goto(f"{srv.url}/?runs=vision#trajectories")
        page.wait_for(f"document.querySelector('.turn-image img') && {_LOADED.format('img')}")
        rec = read_jsonl(vision_runs / "vision" / "trajectories" / "step_000001.jsonl")[0]
        shown = _images(page, ".turn.prompt .turn-image img")
        assert [i["sha"] for i in shown] == [sha for _, sha in rec["images"]]
        for i in shown:
            assert i["done"] and i["natural"] == 64 and i["shown"] == 128  # scaled up 2x
            assert i["src"] == i["link"] == f"/api/runs/vision/images/{i['sha']}"
        texts = page.eval(
            "[...document.querySelectorAll('.turn.prompt pre')].map(p => p.textContent)"
        )
        assert "<image>".join(texts) == rec["prompt_text"]  # the picture sits at its placeholder
        two = next(
            i
            for i, r in enumerate(
                read_jsonl(vision_runs / "vision" / "trajectories" / "step_000001.jsonl")
            )
            if r["task_id"] == "two-pictures"
        )
        page.eval(f"document.querySelector('#sample-list li[data-index=\"{two}\"]').click()")
        page.wait_for(
            f"document.querySelectorAll('.turn.prompt .turn-image img').length === 2 && {_LOADED.format('img')}"
        )
        page.screenshot("trajectories-vision")

        page.goto(f"{srv.url}/?runs=grid#trajectories")
        # An episode that went on past a move, so an observation showed a picture.
        k, rec = next(
            (i, r)
            for i, r in enumerate(
                read_jsonl(vision_runs / "grid" / "trajectories" / "step_000001.jsonl")
            )
            if any(o >= len(r["prompt_ids"]) for o, _ in r["images"])
        )
        page.wait_for(f"document.querySelector('#sample-list li[data-index=\"{k}\"]')")
        page.eval(f"document.querySelector('#sample-list li[data-index=\"{k}\"]').click()")
        page.wait_for(
            f"document.querySelector('.heatmap .tok.image img') && {_LOADED.format('img')}"
        )
        turns = _images(page, ".turn .turn-image img")
        assert [i["sha"] for i in turns] == [sha for _, sha in rec["images"]]
        assert all(i["natural"] == 64 and i["shown"] == 128 for i in turns)
        n_prompt = len(rec["prompt_ids"])
        chips = page.eval(
            "[...document.querySelectorAll('.heatmap .tok.image')].map(c =>"
            " [Number(c.dataset.i), Number(c.dataset.length), c.querySelector('img').naturalWidth])"
        )
        assert chips == [[o - n_prompt, 16, 64] for o, _ in rec["images"] if o >= n_prompt]
        # Every response token is drawn once: as itself, or inside its image's chip.
        spans = page.eval("document.querySelectorAll('.heatmap span.tok').length")
        assert spans == len(rec["response_ids"]) - 15 * len(chips)
        page.screenshot("trajectories-grid")
        # Leave the page before this server goes away, so it stops polling it.
        page.send("Page.navigate", url="about:blank")
        page.wait_for("location.href === 'about:blank' && document.readyState === 'complete'")


@pytest.fixture(scope="module")
def real_runs(tmp_path_factory) -> Path:
    """A real training run's directory: ``$TEMPER_DASH_RUNS`` (e.g. ``runs`` after ``make
    demo``, for screenshots of the demo run) or a short run of the demo config made here."""
    given = os.environ.get("TEMPER_DASH_RUNS")
    if given:
        return Path(given)
    from temper.cli.main import main

    root = tmp_path_factory.mktemp("real-runs")
    code = main(
        [
            "train",
            f"--run.output_dir={root}",
            "--run.name=demo",
            "--orchestrator.steps=3",
            "--orchestrator.prompts_per_step=4",
            "--orchestrator.group_size=4",
            "--eval.size=8",
            "--eval.k=2",
            "--log.progress=false",
        ]
    )
    assert code == 0
    return root


@pytest.mark.slow
def test_dashboard_on_a_real_training_run(browser, real_runs):
    run = next(p.parent.name for p in sorted(real_runs.glob("*/metrics.jsonl")))
    metrics = read_jsonl(real_runs / run / "metrics.jsonl")
    browser.errors.clear()
    with DashboardServer(real_runs, poll_ms=1000) as srv:
        browser.goto(f"{srv.url}/?runs={run}#metrics")
        browser.wait_for("document.querySelectorAll('.chart-card svg circle.pt').length > 0")
        for metric in ("reward_mean", "accuracy"):
            shown = _latest(browser, run, metric)
            assert float(shown["value"]) == metrics[-1][metric]
            assert int(shown["step"]) == metrics[-1]["step"]
        browser.screenshot("real-run-metrics")
        browser.goto(f"{srv.url}/?runs={run}#time")
        browser.wait_for("document.querySelectorAll('#time-chart rect.bar').length > 0")
        bars = browser.eval("document.querySelector('#time-chart svg').dataset.bars")
        assert bars == str(len(metrics))
        browser.screenshot("real-run-step-time")
        browser.goto(f"{srv.url}/?runs={run}#trajectories")
        browser.wait_for("document.querySelectorAll('.heatmap span.tok').length > 0")
        # A sample the trainer trained on has its logprobs, so the mismatch map has values
        # (groups dropped for zero reward variance never reach the trainer).
        last = sorted((real_runs / run / "trajectories").glob("step_*.jsonl"))[-1]
        trained = [i for i, r in enumerate(read_jsonl(last)) if r.get("trainer_logprobs")]
        assert trained, "no trained sample recorded at the last step"
        browser.eval(
            f"document.querySelector('#sample-list li[data-index=\"{trained[0]}\"]').click()"
        )
        browser.eval(
            "(s => { s.value = 'mismatch'; s.dispatchEvent(new Event('change')); })"
            "(document.getElementById('traj-field'))"
        )
        browser.wait_for("document.querySelector('.heatmap').dataset.field === 'mismatch'")
        assert browser.eval("document.querySelectorAll('#sample-detail .note').length") == 0
        browser.screenshot("real-run-trajectories-mismatch")
    assert browser.errors == [], browser.errors
