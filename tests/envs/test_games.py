"""Built-in games: feedback, rewards, invalid turns, hermetic replay, splits, options,
and whole episodes through `run_episodes` (a scripted engine and the tiny model)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

from scripted_engine import RecordingProxy, ScriptedEngine, check_token_io
from temper.builder.tasks import build_env_spec
from temper.engine.base import (
    Engine,
    SamplingParams,
)
from temper.engine.native import NativeEngine
from temper.envs import AssistantTurn, EpisodeLimits, StepResult
from temper.envs.games import (
    WORDS,
    GuessNumberEnv,
    GuessNumberTasks,
    WordleEnv,
    WordleTasks,
    is_heldout,
    wordle_feedback,
)
from temper.errors import ConfigError
from temper.models.loader import load_model, load_tokenizer
from temper.records import Task
from temper.rollout.multi_turn import run_episodes


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def guess_task(secret: int, lo: int = 1, hi: int = 100, max_guesses: int = 7) -> Task:
    return GuessNumberTasks(lo, hi, max_guesses).task(secret)


async def play(env: Any, task: Task, texts: Sequence[str], seed: int | None = 0) -> list[Any]:
    """Reset, then step each text until done; returns [first obs, StepResult, ...]."""
    out: list[Any] = [await env.reset(task, seed)]
    for text in texts:
        result = await env.step(AssistantTurn(text, []))
        out.append(result)
        if result.done:
            break
    return out


# ----------------------------------------------------------------------------- guess the number


def test_guess_number_feedback_rewards_and_success() -> None:
    env = GuessNumberEnv()  # success 1.0, narrow 0.2, valid 0.0, invalid penalty 0.1
    first, r1, r2, r3, r4 = run(
        play(env, guess_task(37), ["50", "I think \\boxed{25}", "hmm, no idea", "37"])
    )
    assert [m["role"] for m in first] == ["user"] and "between 1 and 100" in first[0]["content"]
    assert r1.observation == [{"role": "user", "content": "lower. 6 guesses left."}]
    assert r1.reward == pytest.approx(0.2 * (99 - 48) / 99) and not r1.done  # [1, 49] left
    assert r2.observation[0]["content"] == "higher. 5 guesses left."
    assert r2.reward == pytest.approx(0.2 * (48 - 23) / 99)  # [26, 49] left
    assert r3.observation[0]["content"].startswith("error: no integer found")
    assert r3.reward == -0.1 and not r3.done and r3.metrics == {"invalid_turns": 1.0}
    assert r3.info == {"success": False, "guesses": 2}  # an invalid turn is not a guess
    assert r4.observation[0]["content"] == "correct" and r4.done
    assert r4.info == {"success": True, "guesses": 3}
    assert r4.reward == pytest.approx(1.0 + 0.2 * 23 / 99)
    # Narrowing shaping sums to narrow_reward over a solved episode.
    total = sum(r.reward for r in (r1, r2, r3, r4))
    assert total == pytest.approx(1.0 + 0.2 - 0.1)


def test_guess_number_parsing_and_wasted_guesses() -> None:
    parse = GuessNumberEnv.parse_guess
    assert parse("between 10 and 20 I pick 15") == 15
    assert parse("10? no: \\boxed{60}, not 70") == 60
    assert parse("\\boxed{-4}") == -4 and parse("") is None and parse("\\boxed{x}") is None
    assert parse("9" * 5000) is None  # past int()'s digit limit: invalid, not a crash
    env = GuessNumberEnv(valid_reward=0.05)
    _, r1, r2, r3 = run(play(env, guess_task(37, max_guesses=3), ["60", "80", "1000"]))
    assert r1.reward == pytest.approx(0.05 + 0.2 * (99 - 58) / 99)  # [1, 59] left
    # 80 and 1000 lie outside the known interval [1, 59]: no narrowing, only valid_reward.
    assert r2.reward == pytest.approx(0.05) and r3.reward == pytest.approx(0.05)
    assert r3.done and r3.info == {"success": False, "guesses": 3}
    assert r3.observation[0]["content"] == "lower. No guesses left."
    with pytest.raises(RuntimeError, match="after the end"):
        run(env.step(AssistantTurn("37", [])))


def test_system_prompt_option_reaches_the_first_observation() -> None:
    env = GuessNumberEnv(system_prompt="Play well.")
    first = run(env.reset(guess_task(5), 0))
    assert first[0] == {"role": "system", "content": "Play well."} and first[1]["role"] == "user"


# ----------------------------------------------------------------------------- wordle


def test_word_list() -> None:
    assert len(WORDS) >= 200 and len(set(WORDS)) == len(WORDS)
    assert all(len(w) == 5 and w.isalpha() and w.islower() for w in WORDS)


@pytest.mark.parametrize(
    "guess,secret,marks",
    [
        ("crane", "crane", "GGGGG"),
        ("paper", "apple", "YYGY_"),  # the secret's second p is matched by a yellow
        ("eerie", "crane", "__Y_G"),  # one e in the secret, taken by the green: no yellow e
        ("steel", "tepid", "_YY__"),  # two e guessed, one in the secret: one yellow
        ("about", "crane", "Y____"),
    ],
)
def test_wordle_feedback(guess: str, secret: str, marks: str) -> None:
    assert wordle_feedback(guess, secret) == marks


def test_wordle_rewards_invalid_guesses_and_success() -> None:
    env = WordleEnv()  # success 1.0, green 1.0, invalid penalty 0.1
    task = WordleTasks(max_guesses=6).task("crane")
    texts = ["\\boxed{cr}", "My guess: zzzzz", "12345", "brain", "grade", "\\boxed{CRANE}"]
    first, bad_len, unknown, no_word, r1, r2, r3 = run(play(env, task, texts))
    assert "5-letter" in first[-1]["content"]
    assert bad_len.observation[0]["content"] == "error: 'cr' has 2 letters; guess a 5-letter word"
    assert unknown.observation[0]["content"] == "error: 'zzzzz' is not in the word list"
    assert no_word.observation[0]["content"].startswith("error: no word found")
    for bad in (bad_len, unknown, no_word):
        assert bad.reward == -0.1 and not bad.done and bad.metrics == {"invalid_turns": 1.0}
        assert bad.info == {"success": False, "guesses": 0}
    # brain vs crane: _G_GY? b-c, r=r G, a=a G, i-n, n-e: n is in crane -> Y.
    assert r1.observation[0]["content"] == "BRAIN _GG_Y (5 guesses left)"
    assert r1.reward == pytest.approx(2 / 5)
    # grade: r, a, e green; r and a were green already, only e is new.
    assert r2.observation[0]["content"] == "GRADE _GG_G (4 guesses left)"
    assert r2.reward == pytest.approx(1 / 5)
    assert r3.observation[0]["content"] == "CRANE GGGGG (solved)" and r3.done
    assert r3.reward == pytest.approx(1.0 + 2 / 5) and r3.info == {"success": True, "guesses": 3}


def test_wordle_runs_out_of_guesses() -> None:
    env = WordleEnv()
    task = WordleTasks(max_guesses=2).task("crane")
    _, r1, r2 = run(play(env, task, ["about", "about", "about"]))
    assert not r1.done and r2.done and r2.info == {"success": False, "guesses": 2}
    assert r2.observation[0]["content"] == "ABOUT Y____ (no guesses left)"
    assert r2.reward == 0.0  # no new green


def test_games_never_crash_on_odd_turns() -> None:
    odd = ["", " ", "\\boxed{", "\\boxed{}", "}{", "ñandú 🎲", "x" * 10_000, "-" * 50,
           "1e999", "9" * 5000, "<tool_call>{}</tool_call>", "\\boxed{\\boxed{7}}"]  # fmt: skip
    for env, task in (
        (GuessNumberEnv(), guess_task(50)),
        (WordleEnv(), WordleTasks().task("crane")),
    ):
        run(env.reset(task, 0))
        for text in odd:
            result = run(env.step(AssistantTurn(text, [])))
            assert isinstance(result, StepResult) and isinstance(result.reward, float)
            assert result.observation and result.observation[0]["role"] == "user"
            assert isinstance(result.info["success"], bool)
            if result.done:
                run(env.reset(task, 0))


# ----------------------------------------------------------------------------- hermetic replay


@pytest.mark.parametrize("game", ["guess_number", "wordle"])
def test_replay_is_identical(game: str) -> None:
    """The same task and turn texts give identical observations and rewards, whatever the
    seed and whether the env is fresh or reused."""
    spec = build_env_spec(game, {}, seed=3)
    tasks = spec.train.sample(3) + spec.heldout[:2]
    texts = (
        ["50", "nope", "\\boxed{25}", "75", "12", "88", "60", "40", "30"]
        if game == "guess_number"
        else ["crane", "xx", "brain", "about", "water", "house", "plant", "sound"]
    )

    def transcript(results: list[Any]) -> list[Any]:
        first, *steps = results
        return [first] + [(r.observation, r.reward, r.done, r.info, r.metrics) for r in steps]

    reused = spec.make_env(tasks[0])
    for task in tasks:
        a = transcript(run(play(spec.make_env(task), task, texts, seed=1)))
        b = transcript(run(play(spec.make_env(task), task, texts, seed=987)))
        c = transcript(run(play(reused, task, texts, seed=1)))
        assert a == b == c and len(a) >= 3


# ----------------------------------------------------------------------------- splits


@pytest.mark.parametrize("game", ["guess_number", "wordle"])
def test_heldout_split_is_disjoint_and_stable(game: str) -> None:
    spec = build_env_spec(game, {"eval_size": 1000}, seed=0)
    gen = spec.train.generator
    held = {t.columns["secret"] for t in spec.heldout}
    trained = {t.columns["secret"] for t in spec.train.sample(3000)}
    assert held and trained and not held & trained
    assert all(gen.is_heldout(t) for t in spec.heldout)
    pool = range(1, 101) if game == "guess_number" else WORDS
    expected = {s for s in pool if is_heldout(str(s), gen.salt)}
    assert held == expected  # eval_size beyond the pool: the whole held-out pool
    assert trained == set(pool) - expected  # 3000 draws reach every training secret
    assert 0.1 < len(held) / len(pool) < 0.3
    again = build_env_spec(game, {"eval_size": 5}, seed=99).heldout
    assert [t.id for t in again] == [
        t.id for t in build_env_spec(game, {"eval_size": 5}, 7).heldout
    ]
    assert len(again) == len({t.id for t in again}) == 5


def test_train_sampler_is_seeded_and_resumable() -> None:
    a = build_env_spec("guess_number", {"range": [1, 1000]}, seed=4).train
    b = build_env_spec("guess_number", {"range": [1, 1000]}, seed=4).train
    a.sample(5)
    state = a.state_dict()
    b.load_state_dict(state)
    assert [t.id for t in a.sample(8)] == [t.id for t in b.sample(8)]


# ----------------------------------------------------------------------------- options


@pytest.mark.parametrize(
    "game,options,match",
    [
        ("guess_number", {"rnage": [1, 10]}, r"env\.options\.rnage: unknown option .*allowed:"),
        ("wordle", {"max_guess": 3}, r"env\.options\.max_guess: unknown option for env 'wordle'"),
        ("guess_number", {"range": [10, 1]}, r"env\.options\.range must be \[lo, hi\]"),
        ("guess_number", {"range": "1-10"}, r"env\.options\.range must be"),
        ("guess_number", {"range": [1, 2]}, r"too small for a train/held-out split"),
        ("guess_number", {"success_reward": "big"}, r"success_reward must be a number"),
        ("wordle", {"max_guesses": 0}, r"max_guesses must be an integer >= 1"),
        ("wordle", {"eval_size": True}, r"eval_size must be an integer >= 1"),
        ("wordle", {"system_prompt": 3}, r"system_prompt must be a string"),
    ],
)
def test_option_errors_name_the_key(game: str, options: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match) as err:
        build_env_spec(game, options, 0)
    assert "\n" not in str(err.value)


def test_options_reach_the_env_and_tasks() -> None:
    spec = build_env_spec(
        "guess_number",
        {"range": [0, 9], "max_guesses": 2, "invalid_penalty": 0.5, "success_reward": 2},
        seed=0,
    )
    assert spec.name == "guess_number"
    task = spec.train.sample(1)[0]
    assert task.columns["lo"] == 0 and task.columns["hi"] == 9 and task.columns["max_guesses"] == 2
    _, bad, good = run(play(spec.make_env(task), task, ["?", str(task.columns["secret"])]))
    assert bad.reward == -0.5 and good.reward == pytest.approx(2.0 + 0.2)
    wordle = build_env_spec("wordle", {"green_reward": 0.0, "eval_size": 3}, seed=0)
    assert len(wordle.heldout) == 3
    task = wordle.heldout[0]
    _, r = run(play(wordle.make_env(task), task, ["brain" if task.answer == "about" else "about"]))
    assert r.reward == 0.0 and not r.done  # green_reward 0: a wrong guess earns nothing


# ----------------------------------------------------------------------------- episodes


def test_scripted_engine_plays_guess_number_to_success() -> None:
    tokenizer = load_tokenizer("tiny")
    spec = build_env_spec("guess_number", {}, seed=0)
    task = GuessNumberTasks().task(37)
    replies = ["I will start in the middle: 50", "no idea", "\\boxed{25}", "It is \\boxed{37}"]
    engine = ScriptedEngine(tokenizer, replies, max_context=1024)
    assert isinstance(engine, Engine)
    params = SamplingParams(temperature=0.0, max_new_tokens=64)
    (group,) = run(
        run_episodes(engine, spec.make_env, [task], tokenizer, params, EpisodeLimits(max_turns=8))
    )
    (traj,) = group
    assert traj.finish_reason == "done" and traj.num_turns == 4
    assert traj.env_info["success"] is True and traj.env_info["guesses"] == 3
    assert traj.env_metrics == {"guesses": 3.0, "invalid_turns": 1.0}
    expected = [0.2 * 51 / 99, -0.1, 0.2 * 25 / 99, 1.0 + 0.2 * 23 / 99]  # as in the unit test
    assert traj.turn_rewards == pytest.approx(expected)
    assert traj.reward == pytest.approx(1.0 + 0.2 - 0.1)
    check_token_io(traj, engine.calls)
    # Observations reach the model: the transcript holds the env's answers in order.
    contents = [m["content"] for m in traj.messages if m["role"] == "user"]
    assert contents[1].startswith(("lower", "higher")) and contents[2].startswith("error:")


def test_scripted_engine_plays_wordle_to_success() -> None:
    tokenizer = load_tokenizer("tiny")
    task = WordleTasks().task("crane")
    engine = ScriptedEngine(tokenizer, ["brain", "\\boxed{crane}"], max_context=1024)
    params = SamplingParams(temperature=0.0, max_new_tokens=32)
    spec = build_env_spec("wordle", {}, seed=0)
    (group,) = run(run_episodes(engine, spec.make_env, [task], tokenizer, params, group_size=2))
    for traj in group:
        assert traj.finish_reason == "done" and traj.env_info["success"] is True
        assert traj.turn_rewards == pytest.approx([2 / 5, 1.0 + 3 / 5])
    # Both episodes are identical, so the calls sorted by prompt length are t0, t0, t1, t1.
    check_token_io(group[0], sorted(engine.calls, key=lambda c: len(c[0]))[::2])


def test_tiny_model_episode_is_well_formed_and_token_exact() -> None:
    """The real engine plays badly; the trajectory must still be exact and complete."""
    tokenizer = load_tokenizer("tiny")
    native = NativeEngine(load_model("tiny"), tokenizer, max_slots=4, seed=0)
    recording = RecordingProxy(native)

    spec = build_env_spec("guess_number", {"range": [1, 20], "max_guesses": 3}, seed=0)
    task = spec.train.sample(1)[0]
    params = SamplingParams(temperature=1.0, max_new_tokens=12)
    limits = EpisodeLimits(max_turns=3, continue_after_length=True)

    async def go() -> Any:
        try:
            return await run_episodes(
                recording,
                spec.make_env,
                [task],
                tokenizer,
                params,
                limits,
                seed=5,  # type: ignore[arg-type]
            )
        finally:
            await native.close()

    ((traj,),) = run(go())
    check_token_io(traj, recording.calls)
    assert traj.finish_reason in ("done", "max_turns") and traj.env_error is None
    assert len(traj.turn_rewards) == traj.num_turns >= 1
    assert isinstance(traj.env_info["success"], bool)
    assert all(r == -0.1 or -0.1 < r <= 1.2 for r in traj.turn_rewards)
    assert set(traj.versions) <= {0, -1}
    assert traj.messages[0]["role"] == "user" and traj.messages[1]["role"] == "assistant"
