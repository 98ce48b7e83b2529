"""trainer.mode = "dpo": how online pairs are chosen, short real runs on the tiny model
(held-out preference accuracy rises; online pairs train), one-line refusals."""

import json
import math

import pytest
from safetensors.torch import load_file

from temper.cli.main import main
from temper.models import resolve_model_path
from temper.orchestrator.dpo import pair_groups
from temper.records import Trajectory

SHORT = [
    "--trainer.mode=dpo",
    "--trainer.warmup_steps=0",
    "--eval.size=4",
    "--eval.k=1",
    "--eval.every=0",
    "--log.progress=false",
    "--checkpoint.keep_best=false",
]


def _sample(group, response, reward, error=None):
    n = len(response)
    t = Trajectory(
        task_id=f"t{group}", group_id=group, prompt_ids=[1, 2], response_ids=list(response),
        loss_mask=[1] * n, behaviour_logprobs=[0.0] * n, versions=[0] * n,
        finish_reason="stop", reward=reward,
    )  # fmt: skip
    t.reward_error = error
    return t


def test_online_pairs_are_best_against_worst_of_each_group():
    g0 = [_sample(0, [5], 0.5), _sample(0, [6], 1.0), _sample(0, [7], 1.0), _sample(0, [8], 0.0)]
    g1 = [_sample(1, [5], 1.0), _sample(1, [6], 1.0)]  # equal rewards: no pair
    g2 = [_sample(2, [5], math.nan), _sample(2, [6], 0.0), _sample(2, [7], 2.0, "boom")]
    g3 = [_sample(3, [4], 0.0), _sample(3, [3], 0.0), _sample(3, [9], 1.0)]
    pairs = pair_groups([g0, g1, g2, g3])
    # g0: the first of the best, the worst; g2: NaN and failed scores left out, one left.
    # g3: the last of the equal worst.
    assert [(p.chosen.response_ids, p.rejected.response_ids) for p in pairs] == [
        ([6], [8]),
        ([9], [3]),
    ]
    assert all(p.ref_chosen is None for p in pairs)


def _rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def _eval(run, step):
    return json.loads((run / "eval" / f"step_{step:06d}.json").read_text())


def _moved(run, step):
    shipped = load_file(str(resolve_model_path("tiny") / "model.safetensors"))
    trained = load_file(str(run / "checkpoints" / f"step_{step}" / "model.safetensors"))
    return any(bool((trained[k] != v).any()) for k, v in shipped.items())


def test_dataset_dpo_raises_heldout_preference_accuracy(tmp_path):
    code = main(
        [
            "train", *SHORT, f"--run.output_dir={tmp_path}", "--run.name=dpo",
            "--orchestrator.steps=4", "--orchestrator.prompts_per_step=16",
            "--dpo.size=64", "--dpo.eval_size=64", "--trainer.lr=3e-4",
        ]
    )  # fmt: skip
    assert code == 0
    run = tmp_path / "dpo"
    rows = _rows(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    for r in rows:
        assert r["dpo/pairs"] == 16 and r["samples"] == 32 and r["train_tokens"] > 0
        for key in (
            "loss",
            "margin",
            "reward_accuracy",
            "rewards_chosen",
            "rewards_rejected",
            "kl",
        ):
            assert math.isfinite(r[f"dpo/{key}"])
    # Step 1 starts at the reference: every margin ~0, the loss log 2.
    assert rows[0]["dpo/loss"] == pytest.approx(math.log(2), abs=1e-4)
    start, end = _eval(run, 0), _eval(run, 4)
    assert start["preference_pairs"] == end["preference_pairs"] == 64
    # At step 0 the policy is the reference: every implicit reward is exactly 0 (a tie).
    assert start["preference_accuracy"] == 0.0 and start["preference_margin"] == 0.0
    assert end["preference_accuracy"] > 0.65 and end["preference_margin"] > 0
    assert _moved(run, 4)


@pytest.mark.slow
def test_dataset_dpo_with_lora_trains_the_adapter_only(tmp_path):
    """DPO with ``[lora]``: the reference is the base (the adapter's B starts at 0, so
    step 1's loss is log 2), held-out preference accuracy rises, and the checkpoint
    holds the adapter and no model weights."""
    code = main(
        [
            "train", *SHORT, f"--run.output_dir={tmp_path}", "--run.name=lora",
            "--orchestrator.steps=4", "--orchestrator.prompts_per_step=16",
            "--dpo.size=64", "--dpo.eval_size=64", "--trainer.lr=3e-4", "--lora.rank=4",
        ]
    )  # fmt: skip
    assert code == 0
    run = tmp_path / "lora"
    rows = _rows(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert rows[0]["dpo/loss"] == pytest.approx(math.log(2), abs=1e-4)
    start, end = _eval(run, 0), _eval(run, 4)
    assert start["preference_accuracy"] == 0.0 and start["preference_margin"] == 0.0
    assert end["preference_accuracy"] > 0.6 and end["preference_margin"] > 0
    ckpt = run / "checkpoints" / "step_4"
    adapter = load_file(str(ckpt / "adapter_model.safetensors"))
    assert any("lora_B" in k and bool(v.abs().max() > 0) for k, v in adapter.items())
    assert not list(ckpt.glob("model*.safetensors"))


def test_online_dpo_pairs_samples_by_reward_and_trains(tmp_path):
    code = main(
        [
            "train", *SHORT, f"--run.output_dir={tmp_path}", "--run.name=online",
            "--dpo.pairs=online", "--orchestrator.steps=2", "--orchestrator.prompts_per_step=8",
            "--orchestrator.group_size=4", "--orchestrator.max_response_tokens=24",
            "--trainer.lr=1e-3", "--eval.at_start=false",
        ]
    )  # fmt: skip
    assert code == 0
    run = tmp_path / "online"
    rows = _rows(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["samples"] == 32 and "reward_mean" in r
        assert r["dpo/pairs_frac"] == pytest.approx(r["dpo/pairs"] / 8)
    trained = [r for r in rows if r["dpo/pairs"]]
    assert trained, "no group of either step had two different rewards"
    assert all(math.isfinite(r["dpo/loss"]) and r["grad_norm"] > 0 for r in trained)
    assert _moved(run, 2)
    assert "preference_accuracy" not in _eval(run, 2)  # online runs have no held-out pairs


def _error_lines(capsys):
    err = capsys.readouterr().err.strip().splitlines()
    return [line for line in err if line.startswith("temper:")]


def test_a_row_without_rejected_is_one_line_exit_2(tmp_path, capsys):
    path = tmp_path / "prefs.jsonl"
    good = {"prompt": "What is 1 + 1?", "chosen": "\\boxed{2}", "rejected": "\\boxed{3}"}
    path.write_text(json.dumps(good) + "\n" + json.dumps({"prompt": "hi", "chosen": "yo"}) + "\n")
    code = main(
        ["train", "--trainer.mode=dpo", "--dpo.source=file", f"--dpo.path={path}",
         f"--run.output_dir={tmp_path}", "--log.progress=false"]
    )  # fmt: skip
    assert code == 2
    lines = _error_lines(capsys)
    assert len(lines) == 1
    assert f"{path} line 2: missing field 'rejected'" in lines[0]
    assert not (tmp_path / "demo").exists()  # refused before the run directory is made


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--dpo.beta=0"], "dpo.beta"),
        (["--dpo.beta=-0.5"], "dpo.beta"),
        (["--dpo.loss=ipo", "--dpo.label_smoothing=0.1"], "dpo.label_smoothing applies to"),
        (["--dpo.source=file"], "dpo.path is required"),
        (["--dpo.pairs=online", "--orchestrator.group_size=1"], "group_size >= 2"),
        (["--algo.kl_coef=0.1"], "holds to its reference through dpo.beta"),
    ],
)
def test_bad_dpo_config_is_one_line_exit_2(tmp_path, capsys, flags, message):
    code = main(["train", "--trainer.mode=dpo", f"--run.output_dir={tmp_path}", *flags])
    assert code == 2
    lines = _error_lines(capsys)
    assert len(lines) == 1 and message in lines[0]
