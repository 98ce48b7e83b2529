"""PPO with a critic in real runs: async with stale rollouts, rollout workers in another
process, turn-level GAE on a multi-turn env, and a SIGKILLed run that resumes to the same
metrics as an uninterrupted one (the critic's weights, optimizer and warm-up count come
back from the checkpoint)."""

import json
from pathlib import Path

import pytest
from tests.orchestrator.kill_resume import full_then_killed_and_resumed, step_metrics

from quick_run import QUIET
from temper.cli.main import main

pytestmark = pytest.mark.slow

BASE = [
    "--algo.advantage=gae",
    "--orchestrator.prompts_per_step=4",
    "--orchestrator.group_size=2",
    "--orchestrator.max_response_tokens=16",
    "--trainer.warmup_steps=0",
    *QUIET,
]
CRITIC_KEYS = ("value_loss", "value_mean", "return_mean", "explained_variance", "critic_lr")


def _run(out, *extra):
    assert main(["train", f"--run.output_dir={out}", "--run.name=ppo", *BASE, *extra]) == 0
    return [json.loads(x) for x in (out / "ppo" / "metrics.jsonl").read_text().splitlines()]


def test_async_ppo_trains_the_critic_on_stale_rollouts(tmp_path):
    rows = _run(tmp_path, "--orchestrator.steps=4", "--orchestrator.max_staleness=1")
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert all(k in r for r in rows for k in (*CRITIC_KEYS, "loss", "staleness_max"))
    assert max(r["staleness_max"] for r in rows) >= 1  # the critic saw stale data
    assert rows[-1]["value_mean"] != 0.0  # it moved off its zero start


def test_ppo_with_process_rollout_workers_and_a_value_head(tmp_path):
    rows = _run(
        tmp_path,
        "--orchestrator.steps=2",
        "--orchestrator.backend=process",
        "--critic.kind=head",
        "--critic.warmup_steps=1",
    )
    assert [r["critic_warmup"] for r in rows] == [1.0, 0.0]
    assert "loss" not in rows[0] and "loss" in rows[1]  # warm-up: the critic alone
    assert all(k in r for r in rows for k in CRITIC_KEYS)


def test_turn_level_gae_on_a_multi_turn_env(tmp_path):
    rows = _run(
        tmp_path,
        "--orchestrator.steps=2",
        "--env.type=guess_number",
        "--env.options.max_guesses=4",
        "--env.options.eval_size=2",
        "--env.limits.max_turns=4",
        "--algo.credit=turn",
        "--algo.turn_discount=0.9",
        "--orchestrator.max_response_tokens=8",
    )
    assert all(k in r for r in rows for k in (*CRITIC_KEYS, "loss"))
    assert rows[0]["groups_kept"] == 4  # no group dropped: the critic is the baseline


def test_sigkill_and_resume_matches_uninterrupted(tmp_path):
    args = [
        *BASE,
        "--orchestrator.steps=3",
        "--checkpoint.every=2",
        "--critic.warmup_steps=1",
        "--run.seed=5",
    ]
    full_then_killed_and_resumed(args, tmp_path)
    volatile = ("time_", "gen_tokens_per_s", "train_tokens_per_s", "peak_rss")
    full = step_metrics(tmp_path / "full" / "metrics.jsonl", volatile)
    again = step_metrics(tmp_path / "killed" / "metrics.jsonl", volatile)
    assert sorted(again) == [1, 2, 3]
    assert again[3].keys() == full[3].keys() and "value_loss" in full[3]
    for name, value in full[3].items():
        assert again[3][name] == pytest.approx(value, rel=1e-5, abs=1e-9), name


@pytest.mark.parametrize("kind", ["head", "model"])
def test_ppo_on_the_vision_language_model(tmp_path, kind):
    cfg = str(Path(__file__).parents[2] / "configs" / "vision_grpo.toml")
    out = tmp_path / kind
    args = ["train", cfg, f"--run.output_dir={out}", "--run.name=vlm", *BASE[1:]]
    assert (
        main([*args, "--algo.advantage=gae", f"--critic.kind={kind}", "--orchestrator.steps=1"])
        == 0
    )
    row = json.loads((out / "vlm" / "metrics.jsonl").read_text().splitlines()[0])
    assert all(k in row for k in (*CRITIC_KEYS, "loss")) and row["value_loss"] > 0
