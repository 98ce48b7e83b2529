"""trainer.mode = "sft" and "rft": what an RFT round keeps, short real runs on the tiny
model (weights move, metrics logged, an SFT checkpoint warm-starts RL), config refusals."""

import json
import math

import pytest
from safetensors.torch import load_file

from temper.cli.main import main
from temper.config.self_improve import RFTConfig
from temper.models import resolve_model_path
from temper.orchestrator.self_improve import keep_samples
from temper.records import Trajectory

SHORT = [
    "--orchestrator.steps=2",
    "--orchestrator.prompts_per_step=4",
    "--orchestrator.max_response_tokens=24",
    "--trainer.lr=1e-3",
    "--trainer.warmup_steps=0",
    "--eval.size=8",
    "--eval.k=1",
    "--eval.every=0",
    "--log.progress=false",
]


def _sample(group, response, reward, correct=None, finish="stop"):
    n = len(response)
    return Trajectory(
        task_id=f"t{group}",
        group_id=group,
        prompt_ids=[1, 2],
        response_ids=list(response),
        loss_mask=[1] * n,
        behaviour_logprobs=[0.0] * n,
        versions=[0] * n,
        finish_reason=finish,
        reward=reward,
        correct=correct,
    )


def test_keep_samples_by_correctness_threshold_distinctness_and_cap():
    g0 = [
        _sample(0, [5], 0.0, False),
        _sample(0, [6], 1.0, True),
        _sample(0, [6], 1.0, True),  # the same response again: kept once
        _sample(0, [7], 1.0, True),
        _sample(0, [8], 1.0, True, finish="length"),  # hit the limit: never kept
    ]
    g1 = [_sample(1, [9], 0.5, False), _sample(1, [4], math.nan, None)]  # NaN: failed scoring
    failed = _sample(2, [1], 0.95, None)
    failed.reward_error = "math: timed out"  # scored 0.95 by another component: not kept
    g2 = [_sample(2, [3], 0.2, False), _sample(2, [2], 0.9, False), failed]
    groups = [g0, g1, g2]
    kept = keep_samples(groups, RFTConfig(keep="correct", max_per_prompt=1))
    assert [t.response_ids for t in kept] == [[6]]
    kept = keep_samples(groups, RFTConfig(keep="correct", max_per_prompt=5))
    assert [t.response_ids for t in kept] == [[6], [7]]
    kept = keep_samples(groups, RFTConfig(keep="threshold", threshold=0.5, max_per_prompt=5))
    assert [t.response_ids for t in kept] == [[6], [7], [9], [2]]
    kept = keep_samples(groups, RFTConfig(keep="threshold", threshold=0.1, max_per_prompt=1))
    assert [t.response_ids for t in kept] == [[6], [9], [2]]  # highest reward first


def _rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def _moved(run, step):
    shipped = load_file(str(resolve_model_path("tiny") / "model.safetensors"))
    trained = load_file(str(run / "checkpoints" / f"step_{step}" / "model.safetensors"))
    return any(bool((trained[k] != v).any()) for k, v in shipped.items())


@pytest.mark.slow
def test_sft_run_moves_the_weights_logs_nll_and_warm_starts_rl(tmp_path):
    args = ["train", *SHORT, f"--run.output_dir={tmp_path}", "--eval.at_start=false"]
    assert main([*args, "--run.name=sft", "--trainer.mode=sft", "--trainer.packing=true"]) == 0
    run = tmp_path / "sft"
    rows = _rows(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["nll_per_token"] > 0 and r["train_tokens_per_s"] > 0 and r["policy_version"]
        assert r["samples"] == 4 and "reward_mean" not in r
    assert _moved(run, 2)
    assert json.loads((run / "eval" / "step_000002.json").read_text())["n_tasks"] == 8
    # The SFT checkpoint is a model directory an RL run starts from.
    ckpt = run / "checkpoints" / "step_2"
    rl = [*args, "--run.name=rl", f"--model.path={ckpt}", "--orchestrator.steps=1"]
    assert main([*rl, "--orchestrator.drop_zero_variance_groups=false"]) == 0
    assert "loss" in _rows(tmp_path / "rl" / "metrics.jsonl")[0]


@pytest.mark.slow
def test_rft_run_keeps_rewarded_samples_trains_on_them_and_logs_each_round(tmp_path):
    code = main(
        [
            "train",
            *SHORT,
            f"--run.output_dir={tmp_path}",
            "--run.name=rft",
            "--trainer.mode=rft",
            "--orchestrator.group_size=4",
            "--orchestrator.prompts_per_step=6",
            "--rft.max_per_prompt=2",
            "--eval.every=1",
        ]
    )
    assert code == 0
    run = tmp_path / "rft"
    rows = _rows(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["samples"] == 24 and r["tokens_generated"] > 0
        assert 0 < r["rft/kept"] <= 12  # at most 2 of each prompt's 4 samples
        assert r["rft/kept_frac"] == pytest.approx(r["rft/kept"] / 24)
        assert r["rft/kept"] / 24 <= r["accuracy"]  # only correct samples were kept
        assert r["nll_per_token"] > 0 and r["train_tokens"] > 0
    assert _moved(run, 2)
    evals = sorted((run / "eval").glob("step_*.json"))
    assert [p.name for p in evals] == [f"step_00000{i}.json" for i in (0, 1, 2)]
    trajs = _rows(run / "trajectories" / "step_000001.jsonl")
    assert trajs and all(t["reward"] is not None for t in trajs)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--orchestrator.max_staleness=1"], "runs synchronously"),
        (["--algo.kl_coef=0.1"], "set algo.kl_coef = 0"),
        (["--orchestrator.mode=rollout_only"], "needs orchestrator.mode = 'train'"),
    ],
)
def test_modes_refuse_what_they_do_not_support(tmp_path, capsys, flags, message):
    for mode in ("sft", "rft"):
        assert (
            main(["train", f"--trainer.mode={mode}", f"--run.output_dir={tmp_path}", *flags]) == 2
        )
        assert message in capsys.readouterr().err
