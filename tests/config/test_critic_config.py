"""The `[critic]` section and `algo.advantage = "gae"`: what is refused, in one line, and
what a PPO run may do that a group-baseline run may not (groups of one)."""

import pytest

from temper.cli.main import main
from temper.config import load_config
from temper.orchestrator.run_guard import check_can_learn

REFUSED = {
    "critic_without_gae": (["--critic.kind=head"], "[critic] is set"),
    "gae_field_without_gae": (["--algo.gae_lambda=0.9"], "algo.gae_lambda applies only"),
    "gae_gamma_with_turn_credit": (
        [
            "--algo.advantage=gae",
            "--algo.credit=turn",
            "--algo.gae_gamma=0.9",
            "--env.type=guess_number",
        ],
        "set algo.turn_discount instead",
    ),
    "gae_world_size": (["--algo.advantage=gae", "--trainer.world_size=2"], "world_size = 1"),
    "gae_refill": (["--algo.advantage=gae", "--orchestrator.refill=true"], "refill = false"),
    "gae_sft": (["--algo.advantage=gae", "--trainer.mode=sft"], "no rewards to learn values"),
    "head_with_model_path": (
        ["--algo.advantage=gae", "--critic.kind=head", "--critic.model_path=tiny"],
        "critic.model_path applies",
    ),
    "bad_kind": (["--algo.advantage=gae", "--critic.kind=mlp"], "critic.kind"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_refused_with_one_line_and_exit_2(case, capsys):
    overrides, message = REFUSED[case]
    assert main(["config", "show", *overrides]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err, err
    assert len(err.splitlines()) == 1, err


def test_gae_learns_from_groups_of_one():
    cfg = load_config(None, ["algo.advantage=gae", "orchestrator.group_size=1"])
    check_can_learn(cfg)  # no error: the critic is the baseline
    grpo = load_config(None, ["orchestrator.group_size=1"])
    with pytest.raises(Exception, match="group_size = 1 cannot learn"):
        check_can_learn(grpo)


def test_turn_level_gae_is_allowed_with_an_env():
    cfg = load_config(None, ["algo.advantage=gae", "algo.credit=turn", "env.type=guess_number"])
    check_can_learn(cfg)
    assert cfg.algo.turn_discount == 1.0 and cfg.critic.kind == "model"
