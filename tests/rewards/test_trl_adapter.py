"""TRLRewardFunction and load_reward_function."""

import asyncio

import pytest

from temper.data.base import Task
from temper.errors import TemperError
from temper.rewards import Reward, RewardInput, TRLRewardFunction, load_reward_function


def chat_item(answer: str, completion: str, **columns) -> RewardInput:
    task = Task(
        id="t", prompt=[{"role": "user", "content": "2+2?"}], answer=answer, columns=columns
    )
    return RewardInput(task, "2+2?", completion)


def text_item(completion: str, **columns) -> RewardInput:
    return RewardInput(Task(id="t", prompt="Say hi", columns=columns), "Say hi", completion)


def test_real_trl_accuracy_reward():
    trl_rewards = pytest.importorskip("trl.rewards")
    reward = TRLRewardFunction(trl_rewards.accuracy_reward)
    assert isinstance(reward, Reward) and reward.name == "accuracy_reward"
    out = asyncio.run(
        reward.score([chat_item("4", "It is \\boxed{4}"), chat_item("4", "\\boxed{5}")])
    )
    assert [r.score for r in out] == [1.0, 0.0]
    assert out[0].components == {"accuracy_reward": 1.0}


def length_bonus(prompts, completions, difficulty, **kwargs):
    """A TRL-style function using a dataset column."""
    return [len(c) * (d or 0) for c, d in zip(completions, difficulty, strict=True)]


def test_dataset_columns_are_collated():
    seen = {}

    def spy(prompts, completions, **kwargs):
        seen.update(kwargs, prompts=prompts, completions=completions)
        return [0.0] * len(prompts)

    inputs = [text_item("hi", difficulty=2, source="x"), text_item("hello", difficulty=3)]
    asyncio.run(TRLRewardFunction(spy).score(inputs))
    assert seen == {
        "prompts": ["Say hi", "Say hi"],
        "completions": ["hi", "hello"],
        "difficulty": [2, 3],
        "source": ["x", None],
        "answer": [None, None],
        "solution": [None, None],
    }
    out = asyncio.run(TRLRewardFunction(length_bonus, name="len").score(inputs))
    assert [r.score for r in out] == [4.0, 15.0]


def test_conversational_completions_and_signature_filtering():
    def exact(completions, answer):  # no **kwargs: gets only what it names
        return [float(c[0]["content"] == a) for c, a in zip(completions, answer, strict=True)]

    out = asyncio.run(TRLRewardFunction(exact).score([chat_item("4", "4"), chat_item("4", "5")]))
    assert [r.score for r in out] == [1.0, 0.0]

    def needs_missing(completions, rubric):
        return [0.0] * len(completions)

    with pytest.raises(TemperError, match=r"needs argument\(s\) \['rubric'\]"):
        asyncio.run(TRLRewardFunction(needs_missing).score([chat_item("4", "4")]))


def test_async_function_and_none_values():
    async def judge(prompts, completions, **kwargs):
        await asyncio.sleep(0)
        return [1.0 if c == "good" else None for c in completions]

    out = asyncio.run(TRLRewardFunction(judge).score([text_item("good"), text_item("bad")]))
    assert out[0].score == 1.0 and out[0].error is None
    assert out[1].error == "reward function 'judge' returned None or NaN"
    assert out[1].score == 0.0


def test_exceptions_are_recorded_and_bad_returns_raise():
    def broken(prompts, completions, **kwargs):
        raise KeyError("missing")

    out = asyncio.run(TRLRewardFunction(broken).score([text_item("a")]))
    assert out[0].error == "reward function 'broken' raised KeyError: 'missing'"

    with pytest.raises(TemperError, match="returned 1 values for 2 completions"):
        asyncio.run(TRLRewardFunction(lambda **kw: [1.0], name="short").score([text_item("a")] * 2))
    with pytest.raises(TemperError, match="returned a str at index 0"):
        asyncio.run(TRLRewardFunction(lambda **kw: ["1"], name="s").score([text_item("a")]))
    with pytest.raises(TemperError, match="must return a list"):
        asyncio.run(TRLRewardFunction(lambda **kw: 1.0, name="n").score([text_item("a")]))


def test_run_in_thread():
    def sync(prompts, completions, **kwargs):
        return [0.5] * len(completions)

    out = asyncio.run(TRLRewardFunction(sync, run_in_thread=True).score([text_item("a")]))
    assert out[0].score == 0.5


def test_load_reward_function_by_module_and_file(tmp_path):
    assert load_reward_function("math:sqrt")(9.0) == 3.0
    assert load_reward_function("os:path.join")("a", "b") == "a/b"  # dotted attribute
    path = tmp_path / "my_rewards.py"
    path.write_text(
        "def shout(prompts, completions, **kw):\n    return [float(c.isupper()) for c in completions]\n"
    )
    fn = load_reward_function(f"{path}:shout")
    out = asyncio.run(TRLRewardFunction(fn).score([text_item("HI"), text_item("hi")]))
    assert [r.score for r in out] == [1.0, 0.0]
    assert load_reward_function(f"{path}:shout") is fn  # imported once


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("math.sqrt", "must look like 'package.module:function'"),
        ("no_such_module_xyz:f", "cannot import module 'no_such_module_xyz'"),
        ("math:nope", "'math' has no attribute 'nope'"),
        ("math:pi", "is a float, not a function"),
        ("missing/file.py:f", "file 'missing/file.py' not found"),
    ],
)
def test_load_reward_function_errors(spec, message):
    with pytest.raises(TemperError, match=message.replace("(", r"\(").replace(".", r"\.")) as info:
        load_reward_function(spec)
    assert "\n" not in str(info.value)


def test_load_reward_function_broken_file(tmp_path):
    path = tmp_path / "bad.py"
    path.write_text("def f(:\n")
    with pytest.raises(TemperError, match=r"importing .* failed: SyntaxError"):
        load_reward_function(f"{path}:f")
