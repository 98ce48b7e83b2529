"""Scripted MiniWoB++ policies that read the env's observation text: an oracle and a random one.

They act exactly as a model would, through the JSON actions of
`temper.envs.browser_actions`, from nothing but the observation the model
gets (the instruction and the DOM text lines of `miniwob.render_dom`). They
measure the env, not a model: the oracle shows the observations carry what
is needed and the actions do what they say (tests and
``benchmarks/browser_env.py`` hold it to >= 95% on the tasks in `ORACLE_TASKS`);
the random policy is the floor beside it.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from temper.envs.base import AssistantTurn
from temper.records import Task

#: Tasks the oracle can solve.
ORACLE_TASKS = ("click-button", "click-link", "enter-text", "focus-text", "click-checkboxes")
#: One DOM text line: indent, [ref], optional tag, optional "text", the rest.
_LINE = re.compile(r'^(\s*)\[(-?\d+)\]\s*([a-z0-9_#-]*)\s*(?:"([^"]*)")?(.*)$')
_QUOTED = re.compile(r'"([^"]*)"')


@dataclass
class Element:
    """One line of the DOM text."""

    ref: int
    tag: str
    text: str
    depth: int


def parse_dom_text(text: str) -> list[Element]:
    """The elements listed in an observation's DOM text (other lines are skipped)."""
    out = []
    for line in text.splitlines():
        m = _LINE.match(line)
        if m:
            tag = m.group(3).split("#")[0]
            out.append(Element(int(m.group(2)), tag, m.group(4) or "", len(m.group(1)) // 2))
    return out


def _action(kind: str, **fields: object) -> str:
    return json.dumps({"action": kind, **fields})


def _first(elements: list[Element], pred: Callable[[Element], bool]) -> Element | None:
    return next((e for e in elements if pred(e)), None)


def oracle_plan(task_name: str, observation: str) -> list[str]:
    """The oracle's whole action sequence for one episode, from its first observation."""
    utterance = observation.splitlines()[0]
    quoted = _QUOTED.findall(utterance)
    els = parse_dom_text(observation)
    submit = _first(els, lambda e: e.tag == "button" and e.text.lower() == "submit")
    text_input = _first(els, lambda e: e.tag.startswith("input_text"))
    if task_name == "click-button" and quoted:
        target = _first(els, lambda e: e.tag == "button" and e.text == quoted[0])
        return [_action("click", ref=target.ref)] if target else []
    if task_name == "click-link" and quoted:
        target = _first(els, lambda e: e.ref > 0 and e.text == quoted[0])
        return [_action("click", ref=target.ref)] if target else []
    if task_name == "enter-text" and quoted and text_input and submit:
        return [
            _action("type", ref=text_input.ref, text=quoted[0]),
            _action("click", ref=submit.ref),
        ]
    if task_name == "focus-text" and text_input:
        return [_action("click", ref=text_input.ref)]
    if task_name == "click-checkboxes" and submit:
        wanted = utterance.split("Select", 1)[-1].split("and click", 1)[0]
        names = {w.strip() for w in wanted.replace("Task:", "").split(",") if w.strip()}
        if "nothing" in names:
            names = set()
        plan, box = [], None
        for e in els:
            if e.tag == "input_checkbox":
                box = e
            elif box is not None and e.ref < 0 and e.text in names:
                plan.append(_action("click", ref=box.ref))
                box = None
        return [*plan, _action("click", ref=submit.ref)]
    return []


@dataclass
class Oracle:
    """Plays `oracle_plan` one action per turn; an unknown task gets {"action": "done"}."""

    plan: list[str] = field(default_factory=list)

    def start(self, task: Task, observation: str) -> None:
        self.plan = oracle_plan(str(task.columns["miniwob_task"]), observation)

    def act(self, observation: str) -> str:
        return self.plan.pop(0) if self.plan else _action("done")


@dataclass
class RandomPolicy:
    """Clicks a random listed element, or types a random word into a random text input."""

    rng: random.Random
    elements: list[Element] = field(default_factory=list)

    def start(self, task: Task, observation: str) -> None:
        self.elements = parse_dom_text(observation)

    def act(self, observation: str) -> str:
        fresh = parse_dom_text(observation)
        self.elements = fresh or self.elements
        if not self.elements:
            return _action("done")
        inputs = [e for e in self.elements if e.tag.startswith("input_text")]
        if inputs and self.rng.random() < 0.3:
            word = self.rng.choice(["yes", "submit", "hello", "a"])
            return _action("type", ref=self.rng.choice(inputs).ref, text=word)
        return _action("click", ref=self.rng.choice(self.elements).ref)


def _text(message: dict) -> str:
    content = message["content"]
    if isinstance(content, str):
        return content
    return "\n".join(p.get("text", "") for p in content if p.get("type") == "text")


async def play(env, task: Task, policy, max_turns: int = 8) -> tuple[float, bool]:  # type: ignore[no-untyped-def]
    """One episode of `policy` in `env` without a model; (summed reward, task success).

    The env is reset here but not closed (the caller owns it).
    """
    first = await env.reset(task)
    observation = _text(first[-1])
    policy.start(task, observation)
    total, success = 0.0, False
    for index in range(max_turns):
        text = policy.act(observation)
        result = await env.step(AssistantTurn(text, [], index=index))
        total += result.reward or 0.0
        success = bool(result.info.get("success", success))
        if result.done:
            break
        observation = _text(result.observation[-1]) if result.observation else observation
    return total, success
