"""The TRL reward contract, enforced on real `temper train` runs on the tiny model.

A reward function that returns the wrong number of values is a reported reward
error on every sample of that batch (not rescored one completion at a time, which
would pay each sample whatever the one value is); one that cannot take
`completions` is refused before any work, exit 2.
"""

import asyncio
import json
from pathlib import Path

import pytest

from quick_run import exit_code
from temper.errors import ConfigError
from temper.records import Task
from temper.rewards import RewardInput, TRLRewardFunction

SHORT = (
    "--orchestrator.steps=2",
    "--orchestrator.prompts_per_step=2",
    "--orchestrator.group_size=4",
    "--orchestrator.max_response_tokens=16",
    "--log.trajectories_per_step=0",
    "--reward.filters=[]",
)


def _train(tmp_path: Path, name: str, body: str, *extra: str) -> int:
    path = tmp_path / f"{name}_reward.py"
    path.write_text(body)
    # No spaces: argparse takes an argument with a space for the CONFIG file.
    reward = '--reward.components=[{type="python",function="' + f"{path}:reward" + '"}]'
    return exit_code(tmp_path, name, *SHORT, reward, *extra)


def test_one_value_for_a_batch_is_an_error_on_every_sample(tmp_path, capsys):
    body = "def reward(prompts, completions, **kw):\n    return [1.0]\n"
    # The check before the step-0 eval would stop this run (exit 2,
    # tests/orchestrator/test_reward_check.py): off here, to see the errors counted.
    code = _train(tmp_path, "one", body, "--eval.at_start=true", "--eval.size=2",
                  "--reward.check_samples=0")  # fmt: skip
    err = capsys.readouterr().err
    assert code == 3, err
    assert "reward function 'reward' returned 1 value for 8 completions" in err
    assert "health check reward_errors: the reward failed on 8 of 8 samples" in err
    metrics = json.loads((tmp_path / "one" / "metrics.jsonl").read_text().splitlines()[0])
    assert metrics["reward_errors"] == 8 and metrics["reward_mean"] == 0.0
    [evaluated] = (tmp_path / "one" / "eval").iterdir()
    assert json.loads(evaluated.read_text())["accuracy"] == 0.0  # not 100%


def test_a_function_that_cannot_take_completions_is_refused_at_start(tmp_path, capsys):
    # `a` is a column of the default dataset: the call would work, and score nothing.
    code = _train(tmp_path, "noarg", "def reward(a):\n    return [0.0]\n", "--eval.at_start=true")
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err.splitlines() == [
        "temper: error: reward function 'reward'(a) cannot accept `completions`; a reward "
        "function is called as fn(prompts=..., completions=..., **columns) and must take "
        "`completions` by name or **kwargs"
    ]
    assert not (tmp_path / "noarg").exists()  # refused before any eval or run directory


def test_a_wrong_count_is_an_error_on_the_batch_not_a_rescore():
    calls = []

    def one_value(prompts, completions, **kw):
        calls.append(len(completions))
        return [1.0]

    task = Task(id="t", prompt="Say hi")
    out = asyncio.run(
        TRLRewardFunction(one_value).score([RewardInput(task, "Say hi", c) for c in "abc"])
    )
    assert calls == [3]  # called once: never one completion at a time
    assert [r.score for r in out] == [0.0] * 3
    assert {r.error for r in out} == {
        "reward function 'one_value' returned 1 value for 3 completions"
    }


def _a(a):
    return [0.0]


def _star(*args):
    return [0.0]


def _positional(completions, /):
    return [0.0]


def _named(completions):
    return [0.0]


def _trl(prompts, completions, **kw):
    return [0.0]


def _any(**kw):
    return [0.0]


@pytest.mark.parametrize("fn", [_a, _star, _positional], ids=lambda f: f.__name__)
def test_a_function_without_completions_is_refused(fn):
    with pytest.raises(ConfigError, match="cannot accept `completions`") as info:
        TRLRewardFunction(fn).check_signature(["a"])
    assert f"'{fn.__name__}'(" in str(info.value)


@pytest.mark.parametrize("fn", [_named, _trl, _any], ids=lambda f: f.__name__)
def test_completions_by_name_or_kwargs_is_accepted(fn):
    TRLRewardFunction(fn).check_signature(["a"])
