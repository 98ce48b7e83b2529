"""VisualGrid: a multi-turn env whose observations are rendered pictures of a grid."""

from __future__ import annotations

import asyncio
import random

import pytest

from temper.builder.tasks import build_env_spec
from temper.data.visual import png_bytes
from temper.envs.base import AssistantTurn, Env
from temper.envs.visual_grid import (
    MOVES,
    GridTasks,
    VisualGridEnv,
    make_layout,
    parse_move,
    render_grid,
)
from temper.errors import ConfigError

BLUE, GREEN, BLACK = (40, 70, 220), (30, 170, 60), (0, 0, 0)


def turn(text: str) -> AssistantTurn:
    return AssistantTurn(text=text, token_ids=[])


def picture(result_or_messages):  # type: ignore[no-untyped-def]
    messages = getattr(result_or_messages, "observation", result_or_messages)
    return messages[-1]["content"][0]["image"]


def centre(cell: tuple[int, int]) -> tuple[int, int]:
    return cell[0] * 16 + 8, cell[1] * 16 + 8


def test_layouts_and_pictures_are_pure_functions_of_the_key():
    a, b = make_layout(99), make_layout(99)
    assert a == b and png_bytes(render_grid(a, a.start)) == png_bytes(render_grid(b, b.start))
    assert a.start != a.goal and a.start in a.distances()  # apart and connected
    image = render_grid(a, a.start)
    assert image.getpixel(centre(a.start)) == BLUE
    assert image.getpixel(centre(a.goal)) == GREEN
    assert all(image.getpixel(centre(w)) == BLACK for w in a.walls)


def test_an_oracle_reaches_the_goal_in_the_shortest_number_of_moves():
    async def play(task):  # type: ignore[no-untyped-def]
        env = VisualGridEnv()
        assert isinstance(env, Env) and env.tools == []
        first = await env.reset(task)
        assert first[0]["content"][1]["text"].startswith("You are the blue circle")
        layout, rewards = env.layout, []
        while True:
            result = await env.step(turn(f"\\boxed{{{layout.best_move(env.at)}}}"))
            rewards.append(result.reward)
            image = picture(result)
            assert image.getpixel(centre(env.at)) == BLUE  # the circle, over the goal at the end
            corner = (env.at[0] * 16 + 2, env.at[1] * 16 + 2)
            assert (image.getpixel(corner) == GREEN) == result.done
            if result.done:
                await env.close()
                return result, rewards

    for task in GridTasks().heldout(15):
        result, rewards = asyncio.run(play(task))
        assert result.info["success"] and result.info["moves"] == task.columns["shortest"]
        assert rewards == [0.0] * (len(rewards) - 1) + [1.0]
        assert "reached the green square" in result.observation[0]["content"][1]["text"]


def test_walls_block_invalid_turns_cost_a_penalty_and_moves_run_out():
    async def episode():  # type: ignore[no-untyped-def]
        task = GridTasks(max_moves=3).sample(random.Random(4), 1)[0]
        env = VisualGridEnv(step_penalty=0.05, invalid_penalty=0.2)
        await env.reset(task)
        layout = env.layout
        # The first move (in MOVES order) from the start that is blocked, if any.
        blocked = [m for m, (dx, dy) in MOVES.items()
                   if not layout.open((layout.start[0] + dx, layout.start[1] + dy))]  # fmt: skip
        bad = await env.step(turn("I am not sure"))
        assert bad.reward == -0.2 and not bad.done and bad.metrics == {"invalid_turns": 1.0}
        assert bad.observation[0]["content"].startswith("error:") and env.moves == 0
        hit = await env.step(turn(f"go \\boxed{{{blocked[0]}}}"))
        assert env.at == layout.start and hit.metrics["blocked"] == 1.0
        assert hit.observation[0]["content"][1]["text"].startswith("Blocked")
        assert hit.reward == pytest.approx(-0.05)
        await env.step(turn(f"\\boxed{{{blocked[0]}}}"))
        last = await env.step(turn(f"\\boxed{{{blocked[0]}}}"))
        assert last.done and not last.info["success"] and last.info["moves"] == 3
        with pytest.raises(RuntimeError):
            await env.step(turn("\\boxed{up}"))

    asyncio.run(episode())


def test_parse_move_prefers_the_last_boxed_answer():
    assert parse_move("left then \\boxed{Down}") == "down"
    assert parse_move("\\boxed{up} no, \\boxed{right}") == "right"
    assert parse_move("go left, then up") == "up"
    assert parse_move("\\boxed{north}") is None and parse_move("") is None


def test_registry_spec_options_and_errors():
    spec = build_env_spec("visual_grid", {"size": 3, "walls": 1, "eval_size": 5}, seed=0)
    assert spec.name == "visual_grid" and len(spec.heldout) == 5
    train = spec.train.sample(4)
    assert all(t.columns["size"] == 3 and t.category == "grid" for t in train)
    assert not {t.id for t in train} & {t.id for t in spec.heldout}
    assert isinstance(spec.make_env(train[0]), VisualGridEnv)
    with pytest.raises(ConfigError, match=r"env\.options\.colour: unknown option"):
        build_env_spec("visual_grid", {"colour": 1}, seed=0)
    with pytest.raises(ConfigError, match=r"env\.options: visual_grid needs size >= 2"):
        build_env_spec("visual_grid", {"size": 1}, seed=0)
    with pytest.raises(ConfigError, match=r"env\.options\.max_moves must be"):
        build_env_spec("visual_grid", {"max_moves": "3"}, seed=0)


def test_grid_episodes_of_a_vlm_replay_exactly(tmp_path):
    """Rollouts of the tiny VLM record pictures by hash; replay renders them again and
    finds the same hashes. A changed picture hash is reported."""
    import json

    from temper.config.env import EpisodeLimits
    from temper.engine.base import SamplingParams
    from temper.engine.native import NativeEngine
    from temper.envs.replay import replay_episode
    from temper.models import load_tokenizer, resolve_model_path
    from temper.rollout.multi_turn import run_episodes
    from temper.vision.processor import vision_for
    from temper.vision.prompting import PromptImages
    from temper.vision.store import ImageStore

    engine = NativeEngine.from_pretrained("tiny_vlm")
    tokenizer = load_tokenizer("tiny_vlm")
    vision = vision_for(str(resolve_model_path("tiny_vlm")))
    spec = build_env_spec("visual_grid", {}, 0)
    tasks = spec.heldout[:2]
    groups = asyncio.run(
        run_episodes(
            engine,
            spec.make_env,
            tasks,
            tokenizer,
            SamplingParams(temperature=1.0, max_new_tokens=12),
            EpisodeLimits(max_turns=3, continue_after_length=True),
            seed=4,
            group_size=1,
            images=PromptImages(vision, ImageStore(tmp_path)),
        )
    )
    records = [json.loads(json.dumps(t.to_json())) for g in groups for t in g]
    assert any(len(r["images"]) > 1 for r in records)  # observations showed pictures
    for record in records:
        report = asyncio.run(replay_episode(record, spec))
        assert report.ok, report.mismatches
    shown = next(r for r in records if r["num_turns"] > 1 and r["turn_rewards"])
    for message in shown["messages"][1:]:
        for part in message["content"] if isinstance(message["content"], list) else []:
            if part.get("type") == "image":
                part["sha256"] = "0" * 64
    assert not asyncio.run(replay_episode(shown, spec)).ok
