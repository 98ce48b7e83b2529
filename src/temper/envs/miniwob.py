"""MiniWoB++ tasks: their HTML from the `miniwob` package, a local server, and their JS API.

The `miniwob` PyPI package ships the MiniWoB++ benchmark as static HTML
(``miniwob/html/miniwob/<task>.html`` beside ``core/`` and ``common/``).
`TaskServer` serves that folder on 127.0.0.1 with the standard library's
threaded HTTP server (pages load exactly as in a browser; ``file://`` would
change how some tasks fetch their assets).

An episode uses each task's own JavaScript API (``core.js``):

- `start_episode`: load the page, seed ``Math.seedrandom(seed)``, then
  ``core.startEpisodeReal()`` generates the instance (``genProblem``). The
  task's own 10-second episode timer is pushed out of reach
  (``core.EPISODE_MAX_TIME``): wall-clock limits belong to the rollout loop
  (`EpisodeLimits.timeout_s`), and a reward that depended on how fast the
  machine was would break replay.
- `episode_state`: ``WOB_DONE_GLOBAL`` and ``WOB_RAW_REWARD_GLOBAL`` (the
  task's reward in [-1, 1] before its time discount, so it depends only on
  the actions), plus ``WOB_REWARD_REASON``.
- `read_page`: ``core.getUtterance()`` and ``core.getDOMInfo()`` (the visible
  DOM with stable per-episode ``ref`` numbers), which `render_dom` turns into
  compact text, one element a line.

Same task and seed give the same instance, refs and text (`tests/envs/test_browser_env.py`).
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import random
import threading
from dataclasses import dataclass
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from temper.errors import ConfigError
from temper.records import Task

#: Easy tasks a scripted policy solves from the DOM alone (the default training set).
EASY_TASKS = ("click-button", "click-link", "enter-text", "focus-text", "click-checkboxes")
#: Share of (task, seed) instances in the held-out split, in percent.
HELDOUT_PERCENT = 20
#: Viewport as in MiniWoB++; the task itself occupies the top-left 160 x 210 pixels.
VIEWPORT = (500, 320)
TASK_AREA = (160, 210)
#: Tags a model may want to act on even without text (kept in the DOM text).
_ACTIONABLE = ("input", "button", "a", "select", "option", "textarea", "label", "svg")


def html_root() -> Path:
    """The `miniwob` package's html folder; a one-line `ConfigError` if it is not installed."""
    try:
        import miniwob
    except ImportError:
        raise ConfigError(
            "the miniwob env needs the miniwob package (pip install 'temper-rl[browser]')"
        ) from None
    root = Path(miniwob.__file__).parent / "html"
    if not (root / "miniwob" / "click-button.html").is_file():
        raise ConfigError(f"the miniwob package at {root.parent} has no html/miniwob/ tasks")
    return root


def available_tasks() -> list[str]:
    """Every MiniWoB++ task name the installed package ships (e.g. "click-button")."""
    return sorted(p.stem for p in (html_root() / "miniwob").glob("*.html"))


def check_tasks(names: list[str]) -> list[str]:
    """`names` if every one is a shipped task; else a `ConfigError` naming the unknown ones."""
    known = set(available_tasks())
    unknown = [n for n in names if n not in known]
    if unknown:
        near = sorted({m for u in unknown for m in difflib.get_close_matches(u, known, 3)})
        hint = f"; did you mean {', '.join(near)}?" if near else ""
        raise ConfigError(
            f"env.options.tasks: unknown MiniWoB task(s) {', '.join(map(repr, unknown))} "
            f"({len(known)} tasks available, e.g. {', '.join(EASY_TASKS)}{hint})"
        )
    return names


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        return None


class TaskServer:
    """The miniwob html folder over HTTP on 127.0.0.1 (an ephemeral port), in a daemon thread."""

    def __init__(self) -> None:
        handler = functools.partial(_QuietHandler, directory=str(html_root()))
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, name="temper-miniwob-http", daemon=True
        )
        self.thread.start()

    def url(self, task: str) -> str:
        return f"http://127.0.0.1:{self.httpd.server_port}/miniwob/{task}.html"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)


# ----------------------------------------------------------------------------- tasks


def is_heldout(name: str, seed: int) -> bool:
    """True if instance (name, seed) is in the held-out split; stable across machines."""
    digest = hashlib.sha256(f"temper-miniwob-v1:{name}:{seed}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % 100 < HELDOUT_PERCENT


def make_task(name: str, seed: int) -> Task:
    """The Task for one instance: the page is generated from `seed` at reset.

    The prompt is a placeholder: the real first observation comes from the
    page (`BrowserEnv.reset`).
    """
    return Task(
        id=f"{name}/{seed}",
        prompt=f"MiniWoB++ task {name}, instance {seed}",
        category=name,
        columns={"miniwob_task": name, "miniwob_seed": seed},
    )


@dataclass
class MiniWoBTasks:
    """Procedural (task, seed) instances, split by a hash of both (`is_heldout`)."""

    names: tuple[str, ...]

    def _draw(self, rng: random.Random) -> tuple[str, int]:
        return rng.choice(self.names), rng.randrange(2**31)

    def sample(self, rng: random.Random, k: int = 1) -> list[Task]:
        """k training-split instances drawn from `rng`."""
        out: list[Task] = []
        while len(out) < k:
            name, seed = self._draw(rng)
            if not is_heldout(name, seed):
                out.append(make_task(name, seed))
        return out

    def heldout(self, n: int = 100, seed: int = 1234) -> list[Task]:
        """The same n held-out instances every time, task names in turn."""
        rng, out = random.Random(seed), []
        while len(out) < n:
            name = self.names[len(out) % len(self.names)]
            value = rng.randrange(2**31)
            if is_heldout(name, value):
                out.append(make_task(name, value))
        return out


# ----------------------------------------------------------------------------- page side

_START = """([seed, maxTime]) => {
  core.EPISODE_MAX_TIME = maxTime;
  if (core.EP_TIMER !== null) { clearTimeout(core.EP_TIMER); core.EP_TIMER = null; }
  Math.seedrandom(seed);
  core.startEpisodeReal();
  return typeof WOB_TASK_READY === 'undefined' ? true : WOB_TASK_READY;
}"""
_STATE = """() => ({done: WOB_DONE_GLOBAL, reward: WOB_RAW_REWARD_GLOBAL,
  reason: WOB_REWARD_REASON === null ? null : String(WOB_REWARD_REASON)})"""
_READ = "() => ({utterance: core.getUtterance(), dom: core.getDOMInfo()})"
#: Centre of element `ref` from the last getDOMInfo, scrolled into view; null if gone.
_CENTER = """(ref) => {
  const el = core.previousDOMInfo && core.previousDOMInfo[ref];
  if (!el || !el.isConnected) return null;
  if (el.scrollIntoViewIfNeeded) el.scrollIntoViewIfNeeded(); else el.scrollIntoView();
  const r = el.getBoundingClientRect();
  return [r.left + r.width / 2, r.top + r.height / 2];
}"""
#: Pushed far beyond any rollout timeout (ms); see the module doc.
_NO_TASK_TIMER_MS = 10**9


async def start_episode(page: Any, url: str, seed: int) -> None:
    """Load task `url` in `page` and start the instance generated from `seed` (browser loop)."""
    await page.goto(url, wait_until="load")
    await page.wait_for_function("typeof core !== 'undefined' && core.cover_div !== null")
    ready = await page.evaluate(_START, [str(seed), _NO_TASK_TIMER_MS])
    if not ready:
        await page.wait_for_function("WOB_TASK_READY === true", timeout=10_000)


async def episode_state(page: Any) -> dict[str, Any]:
    """{done, reward (raw, in [-1, 1]), reason} from the task's globals."""
    return await page.evaluate(_STATE)


async def read_page(page: Any) -> dict[str, Any]:
    """{utterance, dom}: the task's instruction and its visible DOM tree with refs."""
    return await page.evaluate(_READ)


async def element_center(page: Any, ref: int) -> tuple[float, float] | None:
    """Viewport coordinates of element `ref`'s centre, or None if it is not on the page."""
    center = await page.evaluate(_CENTER, ref)
    return None if center is None else (float(center[0]), float(center[1]))


# ----------------------------------------------------------------------------- DOM text


def _label(node: dict[str, Any], positions: bool = True) -> str:
    """One element as text: [ref] tag#id "text" value=... (x,y wxh)."""
    tag = str(node.get("tag", "")).lower()
    parts = [f"[{node['ref']}]", "" if tag == "t" else tag]
    if node.get("id") and parts[-1]:
        parts[-1] += f"#{node['id']}"
    text = str(node.get("text") or "").strip()
    if text:
        parts.append(repr_text(text))
    if "value" in node:
        value = node["value"]
        parts.append(f"checked={str(value).lower()}" if isinstance(value, bool) else "")
        if not isinstance(value, bool):
            parts.append(f"value={repr_text(str(value))}")
    if node.get("focused"):
        parts.append("focused")
    if positions:
        x, y, w, h = (round(float(node.get(k, 0))) for k in ("left", "top", "width", "height"))
        parts.append(f"({x},{y} {w}x{h})")
    return " ".join(p for p in parts if p)


def repr_text(text: str, limit: int = 60) -> str:
    """`text` in double quotes, cut at `limit` characters."""
    text = " ".join(text.split())
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    return '"' + text.replace('"', "'") + '"'


def render_dom(
    root: dict[str, Any], positions: bool = True
) -> tuple[str, dict[int, tuple[float, float]]]:
    """Compact text of a getDOMInfo tree and the centre of every listed element.

    One line per element worth reading or acting on: elements with text or a
    value, actionable tags, and leaves. Containers without text of their own
    are skipped and their children not indented further, so a deep tree of
    layout divs costs no tokens. Text fragments (tag ``t``, negative refs in
    MiniWoB) are listed with their ref too: `click` on them clicks their centre.
    `positions=False` leaves out the ``(x,y wxh)`` boxes (a third of the
    tokens) for models that act by ref only.
    """
    lines: list[str] = []
    centers: dict[int, tuple[float, float]] = {}

    def visit(node: dict[str, Any], depth: int) -> None:
        children = node.get("children") or []
        tag = str(node.get("tag", "")).lower()
        shown = (
            bool(str(node.get("text") or "").strip())
            or "value" in node
            or tag.split("_")[0] in _ACTIONABLE
            or (not children and tag not in ("body", "div", "span", "br"))
        )
        if shown and tag != "body":
            lines.append("  " * depth + _label(node, positions))
            ref = int(node.get("ref", 0))
            left, top = float(node.get("left", 0)), float(node.get("top", 0))
            width, height = float(node.get("width", 0)), float(node.get("height", 0))
            centers[ref] = (left + width / 2, top + height / 2)
        for child in children:
            visit(child, depth + (1 if shown and tag != "body" else 0))

    visit(root, 0)
    return "\n".join(lines), centers
