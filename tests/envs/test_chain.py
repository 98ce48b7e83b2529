"""The arithmetic chain env: one question per turn, a reward per right answer (the
intermediate reward turn-level credit uses), the outcome bonus, splits and options."""

import asyncio

import pytest

from temper.algos.turn_credit import episode_turn_rewards
from temper.builder.tasks import build_env_spec
from temper.data.arithmetic import Problem, is_heldout
from temper.envs import AssistantTurn
from temper.envs.chain import ChainEnv, ChainTasks
from temper.errors import ConfigError


def _play(env, task, texts):
    async def go():
        first = await env.reset(task)
        results = [await env.step(AssistantTurn(t, [], index=i)) for i, t in enumerate(texts)]
        return first, results

    return asyncio.run(go())


def test_each_turn_is_rewarded_for_its_own_answer_and_the_outcome_lands_last():
    tasks = ChainTasks(length=3)
    task = tasks.task([Problem(7, "+", 8, 1), Problem(47, "+", 38, 3), Problem(52, "-", 19, 3)])
    env = ChainEnv(step_reward=1.0, success_reward=0.5)
    first, results = _play(env, task, ["\\boxed{15}", "8+7=15. \\boxed{75}", "33"])
    assert first == [{"role": "user", "content": "What is 7 + 8?"}]
    assert [r.reward for r in results] == [1.0, 0.0, 1.0]
    assert [r.observation for r in results[:2]] == [
        [{"role": "user", "content": "What is 47 + 38?"}],
        [{"role": "user", "content": "What is 52 - 19?"}],
    ]
    assert [r.done for r in results] == [False, False, True] and results[2].observation == []
    assert results[2].info == {"success": False, "right": 2}
    _, solved = _play(env, task, ["15", "\\boxed{85}", "\\boxed{33}"])
    assert [r.reward for r in solved] == [1.0, 1.0, 1.5] and solved[2].info["success"]
    # What turn-level credit sees: the env's per-turn rewards, the outcome counted once.
    assert episode_turn_rewards([r.reward for r in solved], 3, 3.5) == [1.0, 1.0, 1.5]
    with pytest.raises(RuntimeError, match="after the end"):
        _play(env, task, ["1", "2", "3", "4"])


def test_training_chains_and_heldout_chains_come_from_their_splits():
    spec = build_env_spec("arithmetic_chain", {"length": 2, "eval_size": 5}, seed=3)
    train = spec.train.sample(20)
    assert len(spec.heldout) == 5 and all(len(t.columns["answers"]) == 2 for t in train)

    def problems(task):
        return [q.removeprefix("What is ").removesuffix("?") for q in task.columns["questions"]]

    def held(text):
        a, op, b = text.split(" ")
        return is_heldout(Problem(int(a), op, int(b), 0))

    assert not any(held(p) for t in train for p in problems(t))
    assert all(held(p) for t in spec.heldout for p in problems(t))
    # The held-out chains do not depend on the run seed.
    assert (
        spec.heldout == build_env_spec("arithmetic_chain", {"length": 2, "eval_size": 5}, 9).heldout
    )


def test_bad_options_are_refused_by_name():
    with pytest.raises(ConfigError, match=r"env\.options\.levels"):
        build_env_spec("arithmetic_chain", {"levels": [7]}, 0)
    with pytest.raises(ConfigError, match=r"env\.options\.length must be an integer >= 1"):
        build_env_spec("arithmetic_chain", {"length": 0}, 0)
    with pytest.raises(ConfigError, match="unknown option"):
        build_env_spec("arithmetic_chain", {"lenght": 2}, 0)
