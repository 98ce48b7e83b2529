"""`reward.components[].type = "reward_model"` and `"judge"` in real `temper train` runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quick_run import QUIET
from scripted_engine import ScriptedEngine
from temper.cli.main import main
from temper.config import config_from_dict
from temper.errors import ConfigError
from temper.models import load_tokenizer
from temper.serve import start_server

COMMON = [
    "--orchestrator.steps=2",
    "--orchestrator.prompts_per_step=2",
    "--orchestrator.group_size=4",
    "--orchestrator.drop_zero_variance_groups=false",
    *QUIET,
]


def _train(tmp_path: Path, components: str, *extra: str) -> list[dict]:
    config = tmp_path / "run.toml"
    config.write_text(f"[reward]\nfilters = []\ncomponents = {components}\n")
    argv = ["train", str(config), f"--run.output_dir={tmp_path}", "--run.name=r", *COMMON]
    assert main([*argv, *extra]) == 0
    lines = (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()
    return [json.loads(x) for x in lines]


@pytest.mark.slow
def test_a_run_scored_by_the_in_process_reward_model(tmp_path):
    metrics = _train(tmp_path, '[{type = "reward_model", model = "tiny-rm"}]')
    assert [m["step"] for m in metrics] == [1, 2]
    for m in metrics:
        assert m["reward_errors"] == 0 and "reward/reward_model" in m
        assert m["reward_std"] > 0  # real scores, not a constant fallback
        assert m["train_tokens"] > 0


@pytest.mark.slow
def test_a_run_scored_by_an_llm_judge_behind_temper_serve(tmp_path):
    tok = load_tokenizer("tiny")
    # The judge gives 9 to answers with a \boxed{} and 2 to the rest.
    engine = ScriptedEngine(
        tok,
        [
            lambda prompt, i: (
                "Score: 9" if "\\boxed" in prompt.split("<response")[-1] else "Score: 2"
            )
        ],
        max_context=100_000,
        by="call",
    )
    handle = start_server(engine, tok, model_name="judge")
    try:
        components = f'[{{type = "judge", base_url = "{handle.base_url}", model = "judge"}}]'
        metrics = _train(tmp_path, components)
    finally:
        handle.stop()
    # Every distinct completion went to the judge once (its cache answers repeats).
    assert 0 < len(engine.prompts) <= 2 * 2 * 4
    for m in metrics:
        assert m["reward_errors"] == 0 and "reward/judge" in m
        assert 0.0 <= m["reward_mean"] <= 1.0  # scores normalised from [0, 10]


def test_model_reward_components_name_what_they_miss():
    with pytest.raises(ConfigError, match="exactly one of 'model'"):
        config_from_dict({"reward": {"components": [{"type": "reward_model"}]}})
    with pytest.raises(ConfigError, match=r"reward\.components\.0\.base_url: Field required"):
        config_from_dict({"reward": {"components": [{"type": "judge", "model": "x"}]}})


@pytest.mark.slow
def test_rlhf_against_the_reward_model_reports_reward_against_kl(tmp_path):
    """The shipped RLHF config, shortened: RM score and KL every step, held-out RM score
    at each eval, and the report's reward-vs-KL plot."""
    config = Path(__file__).resolve().parents[2] / "configs" / "rlhf_tiny_rm.toml"
    argv = ["train", str(config), f"--run.output_dir={tmp_path}", "--run.name=r",
            "--orchestrator.steps=2", "--orchestrator.prompts_per_step=2",
            "--orchestrator.group_size=4", "--orchestrator.drop_zero_variance_groups=false",
            "--data.eval_size=4", "--eval.k=2", "--log.progress=false"]  # fmt: skip
    assert main(argv) == 0
    run = tmp_path / "r"
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    for m in metrics:
        assert "reward/reward_model" in m and m["kl"] >= 0.0
    assert metrics[0]["kl"] == pytest.approx(0.0, abs=1e-6)  # step 1: the policy is the ref
    assert metrics[1]["kl"] > 0.0
    evals = [json.loads((run / "eval" / f"step_{s:06d}.json").read_text()) for s in (0, 2)]
    for e in evals:
        # The held-out reward is the reward model's score (not 0/1 correctness).
        assert e["reward_mean"] not in (0.0, 1.0) and "reward_mean@2" in e
    report = (run / "report.html").read_text()
    assert "reward_vs_kl.png" in report and (run / "plots" / "reward_vs_kl.png").stat().st_size
    assert "Held-out reward (greedy)" in report
