"""The reward is tried on a few real samples before the step-0 eval: a reward that
fails on every one stops the run there, exit 2, with one line on the console and
the full traceback in events.jsonl."""

import asyncio
import json
from pathlib import Path

import pytest

from quick_run import exit_code
from scripted_engine import ScriptedEngine
from temper.backends.base import Rollouts
from temper.config import config_from_dict
from temper.data.sampler import ListSampler
from temper.errors import TemperError
from temper.models import load_tokenizer
from temper.monitor.sinks import JsonlSink
from temper.orchestrator.reward_check import check_reward_on_samples
from temper.records import Task, Trajectory
from temper.rewards import TRLRewardFunction
from temper.rollout.single_turn import PromptRenderer
from temper.rollout.sources import SingleTurnRollouts

TASKS = [Task(f"t{i}", f"q{i}", str(i)) for i in range(6)]


class _Scored:
    """A rollout source whose samples the reward scored as ``errors`` says (None: scored)."""

    def __init__(self, errors: list[str | None]) -> None:
        self.errors, self.asked = errors, []

    async def groups(self, tasks, params, seed=None):
        self.asked.append((len(tasks), params.n))
        groups = []
        for i, task in enumerate(tasks):
            t = Trajectory(task.id, i, [1], [5], [1], [0.0], [0], "stop", response_text="x")
            t.reward_error = self.errors[i]
            groups.append([t])
        return groups, {}


def _check(tmp_path: Path, source, reward=None, n: int = 4) -> list[dict]:
    cfg = config_from_dict({"reward": {"check_samples": n}})
    rollouts = Rollouts(source, ListSampler(TASKS, 0), TASKS[:2], reward, None)
    events = JsonlSink(tmp_path / "events.jsonl")
    try:
        asyncio.run(check_reward_on_samples(cfg, rollouts, None, events))
    finally:
        events.close()
    return [json.loads(x) for x in (tmp_path / "events.jsonl").read_text().splitlines()]


def _raises(completions, **kw):
    raise ValueError("no verifier for this")


def test_one_scored_sample_passes_the_check(tmp_path):
    source = _Scored(["failed", None, "failed", "failed"])
    assert _check(tmp_path, source) == []
    assert source.asked == [(4, 1)]  # one completion for each of check_samples tasks


def test_a_reward_failing_everywhere_stops_with_its_traceback_in_events(tmp_path):
    error = "reward: reward function '_raises' raised ValueError: no verifier for this"
    with pytest.raises(TemperError) as raised:
        _check(tmp_path, _Scored([error] * 4), TRLRewardFunction(_raises))
    message = str(raised.value)
    assert len(message.splitlines()) == 1
    assert message.startswith(
        f"the reward failed on all 4 samples tried before the first eval: {error}"
    )
    [event] = [json.loads(x) for x in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert event["kind"] == "reward_check_failed" and event["samples"] == 4
    assert event["error"] == error and event["task_id"] == "t0"
    assert "Traceback (most recent call last)" in event["traceback"]
    assert 'raise ValueError("no verifier for this")' in event["traceback"]


def test_check_samples_zero_checks_nothing(tmp_path):
    source = _Scored(["failed"] * 4)
    assert _check(tmp_path, source, n=0) == []
    assert source.asked == []


@pytest.mark.slow
def test_an_always_failing_reward_stops_a_real_run_before_the_step_0_eval(tmp_path, capsys):
    path = tmp_path / "bad_reward.py"
    path.write_text(
        "def reward(prompts, completions, **kw):\n    raise ValueError('no verifier')\n"
    )
    code = exit_code(
        tmp_path, "bad",
        '--reward.components=[{type="python",function="' + f"{path}:reward" + '"}]',
        "--reward.filters=[]", "--eval.at_start=true", "--eval.size=2",
        "--orchestrator.max_response_tokens=8",
    )  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2
    [line] = [x for x in err.splitlines() if x.startswith("temper")]  # one line, no traceback
    assert "Traceback" not in err
    assert line.startswith("temper: error: the reward failed on all 4 samples tried before the "
                           "first eval: reward: reward function 'reward' raised ValueError: "
                           "no verifier")  # fmt: skip
    run = tmp_path / "bad"
    assert not (run / "eval").exists() or not list((run / "eval").iterdir())  # no step-0 eval
    events = [json.loads(x) for x in (run / "events.jsonl").read_text().splitlines()]
    [event] = [e for e in events if e["kind"] == "reward_check_failed"]
    assert "Traceback" in event["traceback"] and "ValueError: no verifier" in event["traceback"]
    assert str(path) in event["traceback"]  # the user's own frame


def test_the_check_through_a_real_single_turn_source(tmp_path):
    """Generation scripted, scoring through the real source and reward."""
    tok = load_tokenizer("tiny")
    reward = TRLRewardFunction(_raises)
    source = SingleTurnRollouts(ScriptedEngine(tok, ["\\boxed{1}"]), PromptRenderer(tok), reward)
    with pytest.raises(TemperError, match="raised ValueError: no verifier for this"):
        _check(tmp_path, source, reward)
    [event] = [json.loads(x) for x in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert "ValueError: no verifier for this" in event["traceback"]
