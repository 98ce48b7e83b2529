"""Replay a recorded episode: re-run the env on the recorded actions and compare.

An episode's outcome must depend only on its task, its seed and the policy's
turns (hermetic envs). `replay_episode` checks that for one recorded
trajectory: it resets a fresh env with the recorded task and seed, feeds it
each recorded assistant turn (text, sampled ids, and the tool calls parsed
from the text as the rollout did), and compares every observation and every
per-turn reward with the recording. No engine is involved.

The recording is a trajectory as written to ``runs/<name>/trajectories/``
(`Trajectory.to_json`), which holds the task, the episode seed, the
conversation (``messages``), the sampled-id spans of each turn and the
per-turn rewards. Trajectories of single-turn runs have no task/seed and
cannot be replayed. Recorded messages name images by hash
(`temper.vision.images.loggable`), so the env's fresh observations are
compared in that form: the same pixels give the same hash.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from temper.envs.base import AssistantTurn, Message
from temper.envs.registry import EnvSpec
from temper.errors import TemperError
from temper.models.tool_calls import parse_tool_calls
from temper.records import Task
from temper.vision.images import has_images, loggable, normalize_messages


@dataclass
class ReplayReport:
    """What a replay found: ``ok`` when every observation and reward matched."""

    task_id: str
    turns: int = 0
    mismatches: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.mismatches


def _split_turns(messages: list[Message], first_len: int) -> list[tuple[Message, list[Message]]]:
    """(assistant message, observation messages after it) for each recorded turn."""
    turns: list[tuple[Message, list[Message]]] = []
    for message in messages[first_len:]:
        if message.get("role") == "assistant":
            turns.append((message, []))
        elif turns:
            turns[-1][1].append(message)
    return turns


def _as_recorded(messages: list[Message]) -> list[Message]:
    """Messages as a trajectory records them: image parts become their hashes.

    A replayed task's prompt already names its images by hash (the recorded
    task); such parts stay as they are.
    """
    out = []
    for message in messages:
        content = message.get("content")
        pixels = [p for p in content if "sha256" not in p] if isinstance(content, list) else []
        if has_images([{"content": pixels}]):
            message = loggable(normalize_messages([message]))[0]
        out.append(message)
    return out


async def replay_episode(record: dict[str, Any], spec: EnvSpec) -> ReplayReport:
    """Re-run ``spec``'s env on the recorded turns of ``record``; report every difference."""
    if not record.get("task"):
        raise TemperError(
            f"trajectory {record.get('task_id')!r} has no recorded task: only multi-turn "
            "env episodes can be replayed"
        )
    task = Task(**record["task"])
    report = ReplayReport(task.id)
    env = spec.make_env(task)
    try:
        first = _as_recorded(await env.reset(task, record.get("episode_seed")))
        recorded: list[Message] = record["messages"]
        if recorded[: len(first)] != first:
            report.mismatches.append("first observation differs")
            return report
        spans = record.get("turn_spans") or []
        rewards = record.get("turn_rewards") or []
        response_ids = record.get("response_ids") or []
        turns = _split_turns(recorded, len(first))
        # The last recorded turn may have ended the episode without a step (a limit hit).
        for k, (assistant, observation) in enumerate(turns[: len(rewards)]):
            text = assistant.get("content") or ""
            start, end = spans[k] if k < len(spans) else (0, 0)
            calls, errors = parse_tool_calls(text)
            turn = AssistantTurn(text, list(response_ids[start:end]), calls, errors, "stop", k)
            result = await env.step(turn)
            report.turns += 1
            got = float(result.reward) if result.reward is not None else 0.0
            if got != rewards[k]:
                report.mismatches.append(f"turn {k}: reward {got} != recorded {rewards[k]}")
            if observation and _as_recorded(result.observation or []) != observation:
                report.mismatches.append(f"turn {k}: observation differs")
    finally:
        await env.close()
    return report
