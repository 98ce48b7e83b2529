"""TRLRewardFunction and load_reward_function."""

import asyncio
import math

import pytest

from temper.errors import TemperError
from temper.records import Task
from temper.rewards import Reward, RewardInput, TRLRewardFunction, load_reward_function
from temper.rewards.base import TRAINER_STATE


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
    assert seen.pop("trainer_state") is TRAINER_STATE  # the run's state, as TRL passes its own
    assert seen == {
        "prompts": ["Say hi", "Say hi"],
        "completions": ["hi", "hello"],
        "completion_ids": [None, None],
        "difficulty": [2, 3],
        "source": ["x", None],
        "answer": [None, None],
        "solution": [None, None],
        "category": ["default", "default"],
    }
    out = asyncio.run(TRLRewardFunction(length_bonus, name="len").score(inputs))
    assert [r.score for r in out] == [4.0, 15.0]


def test_trl_arguments_completion_ids_trainer_state_and_category():
    # The arguments TRL's GRPOTrainer passes, which TRL reward functions read.
    seen = {}

    def uses_trl_arguments(prompts, completions, completion_ids, trainer_state, subject):
        seen.update(ids=completion_ids, step=trainer_state.global_step, subject=subject)
        return [float(len(ids)) for ids in completion_ids]

    task = Task(id="t", prompt="q", category="algebra", columns={"subject": "algebra"})
    inputs = [RewardInput(task, "q", "ab", [5, 6]), RewardInput(task, "q", "c", [7])]
    TRAINER_STATE.global_step = 7
    try:
        out = asyncio.run(TRLRewardFunction(uses_trl_arguments).score(inputs))
    finally:
        TRAINER_STATE.global_step = 0
    assert [r.score for r in out] == [2.0, 1.0]
    assert seen == {"ids": [[5, 6], [7]], "step": 7, "subject": ["algebra", "algebra"]}


def test_conversational_completions_and_signature_filtering():
    def exact(completions, answer):  # no **kwargs: gets only what it names
        return [float(c[0]["content"] == a) for c, a in zip(completions, answer, strict=True)]

    out = asyncio.run(TRLRewardFunction(exact).score([chat_item("4", "4"), chat_item("4", "5")]))
    assert [r.score for r in out] == [1.0, 0.0]

    def needs_missing(completions, rubric):
        return [0.0] * len(completions)

    with pytest.raises(TemperError, match=r"needs argument\(s\) \['rubric'\]"):
        asyncio.run(TRLRewardFunction(needs_missing).score([chat_item("4", "4")]))


def test_signature_is_checked_against_the_dataset_columns():
    def needs_rubric(prompts, completions, rubric, **kwargs):
        return [0.0] * len(completions)

    TRLRewardFunction(needs_rubric).check_signature(["rubric", "id"])
    with pytest.raises(TemperError, match=r"'needs_rubric' needs argument\(s\) \['rubric'\]"):
        TRLRewardFunction(needs_rubric).check_signature(["id"])

    def positional_only(completions, /, **kwargs):
        return [0.0] * len(completions)

    with pytest.raises(TemperError, match="cannot be called as fn"):
        TRLRewardFunction(positional_only).check_signature([])


def test_none_means_does_not_apply():
    async def judge(prompts, completions, **kwargs):
        await asyncio.sleep(0)
        return [1.0 if c == "good" else None for c in completions]

    out = asyncio.run(TRLRewardFunction(judge).score([text_item("good"), text_item("bad")]))
    assert out[0].score == 1.0 and out[0].error is None and not out[0].not_applicable
    assert out[1].not_applicable and out[1].error is None


@pytest.mark.parametrize(
    ("value", "said"),
    [(math.nan, "nan"), (math.inf, "inf"), (-math.inf, "-inf"), ("1", "a str"), ([1], "a list")],
)
def test_nan_inf_and_non_numbers_are_errors_of_that_sample_only(value, said):
    def one_bad(prompts, completions, **kwargs):
        return [value if c == "bad" else 0.5 for c in completions]

    reward = TRLRewardFunction(one_bad, failure_score=0.0)
    out = asyncio.run(reward.score([text_item("ok"), text_item("bad"), text_item("ok")]))
    assert [r.score for r in out] == [0.5, 0.0, 0.5]
    assert out[0].error is None and out[2].error is None
    assert (
        out[1].error
        == f"reward function 'one_bad' returned {said}; expected a finite number or None"
    )


def test_numpy_and_bool_values_are_numbers():
    np = pytest.importorskip("numpy")
    out = asyncio.run(
        TRLRewardFunction(lambda **kw: [np.float32(0.25), True], name="n").score(
            [text_item("a"), text_item("b")]
        )
    )
    assert [r.score for r in out] == [0.25, 1.0] and all(r.error is None for r in out)


def test_an_exception_on_one_completion_does_not_zero_the_others():
    calls = []

    def breaks_on_empty(prompts, completions, **kwargs):
        calls.append(len(completions))
        return [1.0 / len(c) for c in completions]  # ZeroDivisionError on ""

    out = asyncio.run(
        TRLRewardFunction(breaks_on_empty).score([text_item("ab"), text_item(""), text_item("a")])
    )
    assert [r.score for r in out] == [0.5, 0.0, 1.0]
    assert out[1].error == (
        "reward function 'breaks_on_empty' raised ZeroDivisionError: float division by zero"
    )
    assert out[0].error is None and out[2].error is None
    assert calls == [3, 1, 1, 1]  # the batch, then one by one


def test_exceptions_and_bad_shapes_are_recorded_per_sample():
    def broken(prompts, completions, **kwargs):
        raise KeyError("missing")

    out = asyncio.run(TRLRewardFunction(broken).score([text_item("a"), text_item("b")]))
    assert [r.error for r in out] == ["reward function 'broken' raised KeyError: 'missing'"] * 2

    [short] = asyncio.run(TRLRewardFunction(lambda **kw: [], name="short").score([text_item("a")]))
    assert short.error == "reward function 'short' returned 0 values for 1 completion"
    [scalar] = asyncio.run(TRLRewardFunction(lambda **kw: 1.0, name="n").score([text_item("a")]))
    assert scalar.error == (
        "reward function 'n' must return a list (of floats, or of "
        '{"score": ..., "correct": ...} dicts), got float'
    )


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


def test_the_category_column_reaches_reward_functions(tmp_path):
    from temper.data.datasets import load_tasks

    path = tmp_path / "rows.jsonl"
    path.write_text('{"question": "1+1?", "answer": "2", "subject": "sums"}\n')
    [task] = load_tasks(path, prompt_field="question", category_field="subject")
    assert task.category == "sums"
    seen = {}

    def by_subject(prompts, completions, subject):
        seen["subject"] = subject
        return [1.0]

    asyncio.run(TRLRewardFunction(by_subject).score([RewardInput(task, "1+1?", "2")]))
    assert seen == {"subject": ["sums"]}
