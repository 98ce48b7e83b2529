"""Computer use: MiniWoB++ tasks in real headless Chromium (``env.type = "miniwob"``).

An episode: `reset` leases a fresh browser context and page from the run's
`BrowserPool`, loads the task from the local `TaskServer` and starts the
instance seeded by the task's ``miniwob_seed`` (the episode seed only when
the task has none). The first observation is one user message: the task's
instruction, the page as compact DOM text (`miniwob.render_dom`:
``[ref] tag "text" (x,y wxh)`` lines) and, unless ``instructions = false``,
a one-line action legend. Each turn the model writes one JSON action
(`browser_actions`); the env performs it with real mouse and keyboard events
over CDP and answers with the page again.

Observations (``observation`` option): ``"dom"`` gives plain-string content;
``"screenshot"`` and ``"dom+screenshot"`` give OpenAI-style content parts,
``[{"type": "text", ...}, {"type": "image", "image": <PNG bytes>}]``, the
screenshot cropped to the 160 x 210 task area (``"screenshot"`` keeps only the
instruction as text, so the model acts with ``click_xy``). Content parts need
a vision-language model and its chat template.

Reward: the task's own, at the step where the task says it is done.
MiniWoB's raw reward is in [-1, 1] (1 success, -1 failure, partial credit in
between for some tasks). ``reward = "unit"`` (default) maps it to
(raw + 1) / 2 in [0, 1]; ``"raw"`` keeps it. An episode the task never ends
(turn limit, timeout, ``{"action": "done"}``) earns 0 either way.
``info["success"]`` is raw > 0. A malformed action gets an ``error: ...``
observation, no reward, and counts in the metrics ``invalid_action`` and
``invalid/<kind>``; an action the page cannot do (no element [ref], an
unknown key) is ``error: ...`` too (``action_failed``).

Isolation: every episode (every `reset`) runs in a fresh browser context
with one page (`BrowserPool.lease`), closed at the episode's end (`close`,
or the next `reset`). Storage, cookies, IndexedDB, sessionStorage,
``window.name``, permissions and history therefore never cross episodes, and
the browser's clipboard is emptied at each lease. Tabs and windows the page
opens are closed at once and counted in the metric ``popups_closed`` (in the
step during which they were closed).
"""

from __future__ import annotations

import asyncio
import atexit
import threading
from typing import Any

from temper.envs.base import AssistantTurn, Message, StepResult
from temper.envs.browser_actions import Action, ActionError, parse_action
from temper.envs.browser_session import BrowserPool, PageSession, find_chromium
from temper.envs.miniwob import (
    EASY_TASKS,
    TASK_AREA,
    VIEWPORT,
    MiniWoBTasks,
    TaskServer,
    check_tasks,
    element_center,
    episode_state,
    read_page,
    render_dom,
    start_episode,
)
from temper.envs.registry import EnvSpec
from temper.errors import ConfigError
from temper.records import Task

OBSERVATIONS = ("dom", "screenshot", "dom+screenshot")
REWARDS = ("unit", "raw")
LEGEND = (
    'Reply with one JSON action: {"action":"click","ref":N} | {"action":"type","ref":N,'
    '"text":"..."} | {"action":"key","key":"Enter"} | {"action":"click_xy","x":X,"y":Y} | '
    '{"action":"scroll","dy":100} | {"action":"done"}'
)
OPTIONS: dict[str, Any] = {
    "tasks": list(EASY_TASKS),
    "observation": "dom",
    "reward": "unit",
    "pool_size": 2,
    "pages_per_browser": 1,
    "eval_size": 100,
    "chromium": None,
    "action_timeout_s": 10.0,
    "instructions": True,
    "reload": "always",  # the only value left; see _options
    "positions": True,
    "boxed_click": False,
}
RELOADS = ("always",)


class BrowserResources:
    """What a run's episodes share: the task server and the browser pool (started lazily)."""

    def __init__(self, pool_size: int, pages_per_browser: int, chromium: str | None) -> None:
        self.pool = BrowserPool(
            pool_size, pages_per_browser=pages_per_browser, executable=chromium, viewport=VIEWPORT
        )
        self._server: TaskServer | None = None
        self._lock = threading.Lock()
        atexit.register(self.close)

    def url(self, task: str) -> str:
        with self._lock:
            if self._server is None:
                self._server = TaskServer()
            return self._server.url(task)

    def close(self) -> None:
        self.pool.close()
        with self._lock:
            if self._server is not None:
                self._server.close()
                self._server = None


class BrowserEnv:
    """One MiniWoB++ episode on a pooled page (see the module doc)."""

    def __init__(
        self,
        resources: BrowserResources,
        observation: str = "dom",
        reward: str = "unit",
        action_timeout_s: float = 10.0,
        instructions: bool = True,
        positions: bool = True,
        boxed_click: bool = False,
    ) -> None:
        self.resources, self.pool = resources, resources.pool
        self.observation, self.reward = observation, reward
        self.action_timeout_s, self.instructions = action_timeout_s, instructions
        self.positions, self.boxed_click = positions, boxed_click
        self.session: PageSession | None = None
        self.finished = True  # until reset
        self.popups_reported = 0  # of session.popups_closed, already in a step's metrics
        self.centers: dict[int, tuple[float, float]] = {}

    @property
    def tools(self) -> list[dict[str, Any]]:
        return []

    async def _run(self, coro: Any) -> Any:
        """Run a page coroutine on the browser loop within `action_timeout_s`."""
        return await self.pool.call(asyncio.wait_for(coro, self.action_timeout_s))

    @property
    def page(self) -> Any:
        if self.session is None or self.session.page is None:
            raise RuntimeError("BrowserEnv: no page (step before reset, or after close)")
        return self.session.page

    async def reset(self, task: Task, seed: int | None = None) -> list[Message]:
        name = task.columns.get("miniwob_task")
        if not isinstance(name, str):
            raise ValueError(f"task {task.id} has no miniwob_task column")
        instance = task.columns.get("miniwob_seed", seed if seed is not None else 0)
        await self.close()  # a second reset is a new episode: a new context too
        self.session, self.popups_reported = await self.pool.lease(), 0
        self.finished = False
        await self._run(start_episode(self.page, self.resources.url(name), instance))
        return [await self._observe(first=True)]

    async def _observe(self, first: bool) -> Message:
        """The page as a user message (text, or text + screenshot parts)."""
        state = await self._run(read_page(self.page))
        dom, self.centers = render_dom(state["dom"], self.positions)
        lines = [f"Task: {state['utterance']}"] if first else []
        if self.observation != "screenshot":
            lines.append(dom if first else f"Page:\n{dom}")
        if first and self.instructions:
            lines.append(LEGEND)
        text = "\n".join(lines)
        if self.observation == "dom":
            return {"role": "user", "content": text}
        width, height = TASK_AREA
        clip = {"x": 0, "y": 0, "width": width, "height": height}
        png = await self._run(self.page.screenshot(clip=clip, type="png"))
        return {
            "role": "user",
            "content": [{"type": "text", "text": text}, {"type": "image", "image": png}],
        }

    async def step(self, turn: AssistantTurn) -> StepResult:
        if self.session is None or self.finished:
            raise RuntimeError("BrowserEnv.step called before reset or after the episode ended")
        result = await self._step(turn)
        popups = self.session.popups_closed - self.popups_reported
        if popups:  # closed on the browser loop since the last step
            self.popups_reported += popups
            result.metrics["popups_closed"] = float(popups)
        return result

    async def _step(self, turn: AssistantTurn) -> StepResult:
        try:
            action = parse_action(turn.text, self.boxed_click)
        except ActionError as exc:
            metrics = {"invalid_action": 1.0, f"invalid/{exc.kind}": 1.0}
            return self._error(str(exc), {"action_error": exc.kind}, metrics)
        if action.kind == "done":
            self.finished = True  # the model ended it; the task did not
            return StepResult([], None, True, {"success": False, "ended_by": "model"})
        failure = await self._run(self._act(self.page, action, dict(self.centers)))
        if failure:
            return self._error(failure, {"action_error": "failed"}, {"action_failed": 1.0})
        state = await self._run(episode_state(self.page))
        if state["done"]:
            self.finished = True
            raw = float(state["reward"])
            reward = raw if self.reward == "raw" else (raw + 1.0) / 2.0
            info = {"success": raw > 0, "raw_reward": raw, "reason": state["reason"]}
            return StepResult([], reward, True, info, {"actions": 1.0})
        return StepResult([await self._observe(first=False)], None, False, {}, {"actions": 1.0})

    def _error(self, message: str, info: dict[str, Any], metrics: dict[str, float]) -> StepResult:
        msg = {"role": "user", "content": f"error: {message}"}
        return StepResult([msg], None, False, {"success": False, **info}, metrics)

    @staticmethod
    async def _act(
        page: Any, action: Action, centers: dict[int, tuple[float, float]]
    ) -> str | None:
        """Perform `action` on `page` (browser loop); a message if the page cannot do it."""
        from playwright.async_api import Error as PlaywrightError

        point: tuple[float, float] | None = None
        if action.ref is not None:
            if action.ref > 0:  # an element: its centre now (it may have moved)
                point = await element_center(page, action.ref)
            else:  # a text fragment: where the last observation showed it
                point = centers.get(action.ref)
            if point is None:
                return f"no element [{action.ref}] on the page"
        try:
            if action.kind == "click":
                await page.mouse.click(*point)  # type: ignore[misc]
            elif action.kind == "click_xy":
                await page.mouse.click(action.x, action.y)
            elif action.kind == "type":
                if point is not None:
                    await page.mouse.click(*point)
                await page.keyboard.type(action.text)
            elif action.kind == "key":
                await page.keyboard.press(action.key)
            elif action.kind == "scroll":
                if point is not None:
                    await page.mouse.move(*point)
                await page.mouse.wheel(action.dx, action.dy)
        except PlaywrightError as exc:
            if action.kind == "key":
                return f"cannot press key {action.key!r}: {str(exc).splitlines()[0]}"
            raise
        return None

    async def close(self) -> None:
        """End the episode: its context, with every page it opened, is closed."""
        session, self.session, self.finished = self.session, None, True
        if session is not None:
            await self.pool.release(session)


def _options(options: dict[str, Any]) -> dict[str, Any]:
    """Options with defaults filled in; one clear ConfigError per bad value."""
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise ConfigError(
            f"env.options: unknown option(s) {unknown} for miniwob; allowed {sorted(OPTIONS)}"
        )
    opts = {**OPTIONS, **options}
    tasks = opts["tasks"]
    if isinstance(tasks, str):
        tasks = [tasks]
    if not isinstance(tasks, list) or not tasks or not all(isinstance(t, str) for t in tasks):
        raise ConfigError(f"env.options.tasks must be a list of MiniWoB task names, got {tasks!r}")
    opts["tasks"] = check_tasks(tasks)
    if opts["reload"] == "task_change":
        raise ConfigError(
            "env.options.reload = 'task_change' is gone: every episode now runs in a fresh "
            "browser context, so no loaded page is reused; use 'always' (the default)"
        )
    for key, allowed in (("observation", OBSERVATIONS), ("reward", REWARDS), ("reload", RELOADS)):
        if opts[key] not in allowed:
            raise ConfigError(
                f"env.options.{key} must be one of {list(allowed)}, got {opts[key]!r}"
            )
    for key in ("pool_size", "pages_per_browser", "eval_size"):
        if type(opts[key]) is not int or opts[key] < 1:
            raise ConfigError(f"env.options.{key} must be an integer >= 1, got {opts[key]!r}")
    value = opts["action_timeout_s"]
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 600:
        raise ConfigError(
            f"env.options.action_timeout_s must be a number in (0, 600], got {value!r}"
        )
    for key in ("instructions", "positions", "boxed_click"):
        if not isinstance(opts[key], bool):
            raise ConfigError(f"env.options.{key} must be true or false, got {opts[key]!r}")
    opts["chromium"] = find_chromium(opts["chromium"])
    return opts


def spec(options: dict[str, Any], seed: int) -> EnvSpec:
    """Spec factory for ``env.type = "miniwob"``.

    Options: ``tasks`` (MiniWoB++ task names, default the five easy ones in
    `miniwob.EASY_TASKS`), ``observation`` ("dom" | "screenshot" |
    "dom+screenshot"), ``reward`` ("unit" | "raw"), ``pool_size`` (browsers,
    default 2), ``pages_per_browser`` (default 1), ``eval_size`` (held-out
    instances, default 100), ``chromium`` (executable; default from PATH),
    ``action_timeout_s`` (one browser call, default 10), ``instructions``
    (the action legend in the first observation, default true), ``reload``
    (only "always" is left: every episode loads the task in a fresh browser
    context), ``positions``
    (element boxes in the DOM text, default true), ``boxed_click`` (a turn
    with no JSON but a last ``\\boxed{N}`` clicks [N]; default false; see
    `browser_actions`). Chromium and
    the task names are checked here; browsers start with the first episode.
    """
    from temper.data.sampler import ProceduralSampler

    opts = _options(options)
    tasks = MiniWoBTasks(tuple(opts["tasks"]))
    resources = BrowserResources(opts["pool_size"], opts["pages_per_browser"], opts["chromium"])

    def make_env(task: Task) -> BrowserEnv:
        return BrowserEnv(
            resources,
            opts["observation"],
            opts["reward"],
            float(opts["action_timeout_s"]),
            opts["instructions"],
            opts["positions"],
            opts["boxed_click"],
        )

    return EnvSpec(
        make_env=make_env,
        train=ProceduralSampler(tasks, seed),
        heldout=tasks.heldout(opts["eval_size"]),
        close=resources.close,
    )
