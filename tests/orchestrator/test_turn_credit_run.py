"""A real guess_number run with turn-level credit: per-turn advantages reach the
trainer, land in the run directory, and a train_only run replays them."""

import json

import pytest

from temper.cli.main import main
from temper.config import load_config
from temper.errors import ConfigError


def _train(out, *extra):
    args = [
        "train",
        f"--run.output_dir={out}",
        "--run.name=credit",
        "--env.type=guess_number",
        "--env.options.max_guesses=4",
        "--env.options.eval_size=2",
        "--env.limits.max_turns=4",
        "--algo.credit=turn",
        "--algo.turn_discount=0.9",
        "--orchestrator.steps=1",
        "--orchestrator.prompts_per_step=2",
        "--orchestrator.group_size=4",
        "--orchestrator.max_response_tokens=8",
        "--eval.every=0",
        "--eval.at_end=false",
        "--log.progress=false",
        "--log.trajectories_per_step=8",
        "--checkpoint.at_end=false",
        *extra,
    ]
    assert main(args) == 0
    return out / "credit"


@pytest.mark.slow
def test_turn_credit_run_trains_with_advantages_that_differ_across_turns(tmp_path):
    run = _train(tmp_path / "a")
    metrics = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
    assert "loss" in metrics
    records = [json.loads(x) for x in (run / "trajectories" / "step_000001.jsonl").open()]
    differing = 0
    for r in records:
        adv = r["token_advantages"]
        assert len(adv) == len(r["response_ids"])
        per_turn = [set(adv[s:e]) for s, e in r["turn_spans"]]
        assert all(len(values) == 1 for values in per_turn if values)  # one value per turn
        outside = [a for a, m in zip(adv, r["loss_mask"], strict=True) if not m]
        assert set(outside) <= {0.0}  # observation tokens carry nothing
        differing += len({v for values in per_turn for v in values}) > 1
    assert differing > 0
    # train_only reads the recorded per-token advantages back (and recomputes them).
    replay = _train(
        tmp_path / "b",
        "--orchestrator.mode=train_only",
        f"--orchestrator.train_from={run / 'trajectories'}",
    )
    assert "loss" in json.loads((replay / "metrics.jsonl").read_text().splitlines()[0])


def test_turn_credit_is_refused_without_an_env_and_discount_without_turn_credit():
    for overrides, words in (
        (["algo.credit=turn"], "algo.credit = 'turn' needs a multi-turn env"),
        (["algo.turn_discount=0.5"], "algo.turn_discount = 0.5 applies only with"),
    ):
        try:
            load_config(None, overrides)
        except ConfigError as err:
            assert words in str(err) and "\n" not in str(err)
        else:
            raise AssertionError(f"{overrides} was accepted")
