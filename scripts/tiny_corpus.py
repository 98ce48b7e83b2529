"""The synthetic chat corpus the built-in tiny model is pretrained on.

Three kinds of conversation, each a list of chat messages (plus an optional
`tools` list) to be rendered through the chat template:

- arithmetic: a training-split problem from `temper.data.arithmetic`,
  answered either directly (`\\boxed{N}`, careless on carries/borrows with
  probability `mistake_rate`) or with the worked digit-by-digit solution
  (always right); see `arithmetic_chat`.
- generic: short templated small talk, facts, counting and comparisons.
- tool: a `temper.envs.tool_use` task (calculator, price lookup, lookup then
  calculator, or a python program), solved with its tools, or blurted (wrong)
  without them; see `tool_chat`.

Everything is drawn from the `random.Random` passed in, so a seed fixes the corpus.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from temper.data.arithmetic import is_heldout, make_problem, mistake_for, solve, worked_solution
from temper.envs.tool_use import CATEGORIES, make_task, tool_schemas, transcript

SYSTEM_PROMPTS = (
    "You are a helpful assistant.",
    "You are a careful math tutor.",
    "Answer briefly.",
)

_CAPITALS = {
    "France": "Paris", "Germany": "Berlin", "Italy": "Rome", "Spain": "Madrid",
    "Japan": "Tokyo", "Canada": "Ottawa", "Egypt": "Cairo", "Peru": "Lima",
    "Kenya": "Nairobi", "Norway": "Oslo", "Greece": "Athens", "Chile": "Santiago",
}  # fmt: skip
_KINDS = {
    "color": ("red", "blue", "green", "yellow", "purple", "orange"),
    "fruit": ("apple", "banana", "cherry", "grape", "mango", "pear"),
    "animal": ("cat", "dog", "horse", "rabbit", "tiger", "owl"),
    "planet": ("Mars", "Venus", "Earth", "Jupiter", "Saturn", "Mercury"),
}
_GREETINGS = ("Hi!", "Hello.", "Hey there!", "Good morning!", "Hi, who are you?")
_REPLIES = (
    "Hello! How can I help you today?",
    "Hi! I can help with arithmetic and short questions.",
    "Hello! Ask me anything.",
)
_THANKS = ("Thanks!", "Thank you.", "Great, thanks!")
_WELCOME = ("You're welcome!", "Glad to help.", "Any time!")


@dataclass
class Chat:
    """One conversation: messages and, for tool chats, the tool schemas."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    kind: str = "arithmetic"
    meta: dict[str, Any] = field(default_factory=dict)


#: Share of each arithmetic level in the corpus (the demo trains on levels 1-3).
LEVEL_WEIGHTS: dict[int, float] = {1: 1 / 3, 2: 1 / 3, 3: 1 / 3}


def arithmetic_chat(rng: random.Random, direct_rate: float, mistake_rate: float) -> Chat:
    """A training-split question and an answer in one of two styles.

    With probability `direct_rate` the assistant answers at once with only
    `\\boxed{N}`, and for a problem with a carry or borrow it is careless with
    probability `mistake_rate` (N is what forgetting the carry/borrow gives).
    Otherwise it writes the worked, digit-by-digit solution, which is always
    right. So the pretrained model mostly blurts, often wrongly, yet knows how to
    work the problem: RL has a skill to find and reward.
    """
    level = rng.choices(list(LEVEL_WEIGHTS), weights=list(LEVEL_WEIGHTS.values()))[0]
    problem = make_problem(rng, level)
    while is_heldout(problem):
        problem = make_problem(rng, level)
    mistake = None
    if rng.random() < direct_rate:
        mistake = mistake_for(problem) if rng.random() < mistake_rate else None
        answer = f"\\boxed{{{solve(problem, mistake)}}}"
        style = "direct"
    else:
        answer = worked_solution(problem)
        style = "worked"
    messages = [
        {"role": "user", "content": problem.prompt},
        {"role": "assistant", "content": answer},
    ]
    return Chat(
        messages,
        kind="arithmetic",
        meta={"level": problem.level, "mistake": mistake, "style": style},
    )


def _generic_turn(rng: random.Random) -> tuple[str, str]:
    kind = rng.randrange(7)
    if kind == 0:
        return rng.choice(_GREETINGS), rng.choice(_REPLIES)
    if kind == 1:
        country = rng.choice(sorted(_CAPITALS))
        return (
            f"What is the capital of {country}?",
            f"The capital of {country} is {_CAPITALS[country]}.",
        )
    if kind == 2:
        name = rng.choice(sorted(_KINDS))
        return f"Name a {name}.", f"{rng.choice(_KINDS[name]).capitalize()}."
    if kind == 3:
        start = rng.randint(0, 20)
        stop = start + rng.randint(2, 5)
        nums = ", ".join(str(i) for i in range(start, stop + 1))
        return f"Count from {start} to {stop}.", f"{nums}."
    if kind == 4:
        a, b = rng.sample(range(100), 2)
        return f"Which is larger, {a} or {b}?", f"{max(a, b)} is larger."
    if kind == 5:
        n = rng.randint(0, 98)
        return f"What number comes after {n}?", f"{n + 1} comes after {n}."
    return rng.choice(_THANKS), rng.choice(_WELCOME)


def generic_chat(rng: random.Random) -> Chat:
    """One or two turns of templated small talk."""
    messages: list[dict[str, Any]] = []
    if rng.random() < 0.3:
        messages.append({"role": "system", "content": rng.choice(SYSTEM_PROMPTS)})
    for _ in range(1 if rng.random() < 0.7 else 2):
        user, assistant = _generic_turn(rng)
        messages += [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
    return Chat(messages, kind="generic")


def tool_chat(rng: random.Random, blurt_rate: float) -> Chat:
    """A `temper.envs.tool_use` task (any category) with its tools.

    With probability `blurt_rate` the assistant skips the tools and blurts a
    plausible but wrong number; otherwise it follows the ideal transcript
    (`temper.envs.tool_use.transcript`). So the pretrained model knows each
    tool but does not always reach for it: RL has a habit to reinforce.
    """
    category = rng.choice(CATEGORIES)
    task = make_task(category, rng)
    tools = tool_schemas(category)
    if rng.random() < blurt_rate:
        gold = int(str(task.answer))
        guess = gold + rng.choice([-1, 1]) * rng.randint(1, max(2, gold // 10))
        messages = [
            {"role": "user", "content": str(task.prompt)},
            {"role": "assistant", "content": f"\\boxed{{{guess}}}"},
        ]
        return Chat(messages, tools=tools, kind="tool_blurt", meta={"category": category})
    return Chat(transcript(task), tools=tools, kind="tool", meta={"category": category})


def build_corpus(
    n: int,
    rng: random.Random,
    direct_rate: float,
    mistake_rate: float,
    generic_share: float = 0.03,
    tool_share: float = 0.2,
    blurt_rate: float = 0.5,
) -> list[Chat]:
    """n conversations: mostly arithmetic, plus generic and tool chats."""
    chats = []
    for _ in range(n):
        u = rng.random()
        if u < tool_share:
            chats.append(tool_chat(rng, blurt_rate))
        elif u < tool_share + generic_share:
            chats.append(generic_chat(rng))
        else:
            chats.append(arithmetic_chat(rng, direct_rate, mistake_rate))
    return chats
