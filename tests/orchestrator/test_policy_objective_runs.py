"""A real `temper train` run on the tiny model for each new objective (GSPO, CISPO,
full REINFORCE++), and the config refusing combinations that would do nothing."""

import json
import math
from pathlib import Path

import pytest
from safetensors.torch import load_file

from quick_run import QUIET
from temper.cli.main import main
from temper.config import load_config
from temper.models import resolve_model_path

SHORT = [
    "--orchestrator.steps=2",
    "--orchestrator.prompts_per_step=2",
    "--orchestrator.group_size=4",
    "--orchestrator.max_response_tokens=16",
    "--orchestrator.drop_zero_variance_groups=false",
    "--log.trajectories_per_step=0",
    "--trainer.lr=1e-3",
    "--trainer.warmup_steps=0",
    *QUIET,
    "--checkpoint.at_end=true",  # the final weights are compared
]

RUNS = {
    "gspo": ["--algo.policy_loss=gspo", "--algo.loss_agg=seq-mean-token-mean"],
    "cispo": ["--algo.policy_loss=cispo"],
    "reinforce_pp": ["--algo.advantage=reinforce_pp", "--algo.reward_kl_coef=0.1"],
}
OWN_METRIC = {"gspo": "seq_ratio_mean", "cispo": "cispo_weight_mean", "reinforce_pp": "reward_kl"}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(RUNS))
def test_a_short_run_trains_with_the_objective(tmp_path: Path, name: str):
    argv = ["train", f"--run.output_dir={tmp_path}", f"--run.name={name}", *SHORT, *RUNS[name]]
    assert main(argv) == 0
    run = tmp_path / name
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    trained = [m for m in metrics if "loss" in m]
    assert len(trained) == 2
    assert all(math.isfinite(m["loss"]) and math.isfinite(m[OWN_METRIC[name]]) for m in trained)
    shipped = load_file(str(resolve_model_path("tiny") / "model.safetensors"))
    final = load_file(str(run / "checkpoints" / "step_2" / "model.safetensors"))
    assert any(bool((final[k] != shipped[k]).any()) for k in shipped), "weights did not move"


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        (["--algo.policy_loss=gspo", "--algo.dual_clip=3"], ["algo.dual_clip", "'gspo'"]),
        (["--algo.policy_loss=cispo", "--algo.dual_clip=3"], ["algo.dual_clip", "'cispo'"]),
        (["--algo.reward_kl_coef=0.1"], ["algo.reward_kl_coef", "'reinforce_pp'", "'grpo'"]),
        (["--algo.policy_loss=gspo", "--algo.gspo_clip_low=1"], ["algo.gspo_clip_low", "than 1"]),
        (["--algo.policy_loss=grpo"], ["algo.policy_loss", "'gspo' or 'cispo'"]),
    ],
)
def test_refused_combinations_exit_2_with_one_line_naming_the_keys(
    tmp_path: Path, capsys, overrides: list[str], named: list[str]
):
    assert main(["train", f"--run.output_dir={tmp_path}", *SHORT, *overrides]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and all(part in err[0] for part in named), err
    assert not (tmp_path / "demo").exists()


def test_the_new_keys_combine_with_every_aggregation_and_correction():
    for loss_agg in ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean"):
        for correction in ("none", "behaviour", "tis", "mis", "decoupled"):
            for objective in ("ppo", "gspo", "cispo"):
                algo = load_config(
                    None,
                    [
                        f"algo.policy_loss={objective}",
                        "algo.advantage=reinforce_pp",
                        "algo.reward_kl_coef=0.05",
                        f"algo.loss_agg={loss_agg}",
                        f"algo.off_policy_correction={correction}",
                    ],
                ).algo
                assert algo.policy_loss == objective and algo.uses_reference
