"""Health guardrails: each check fires on its pattern, and a stop action checkpoints and stops."""

import json
import math

import torch

from temper.cli.main import main
from temper.config.health import HealthCheck, HealthConfig
from temper.monitor.health import HealthMonitor

GOOD = {
    "loss": 0.1, "grad_norm": 1.0, "entropy": 0.8, "kl": 0.01, "reward_mean": 0.3,
    "train_infer_logprob_diff": 1e-6, "response_len_mean": 20.0, "gen_tokens_per_s": 1000.0,
}  # fmt: skip


def _kinds(alerts):
    return [a.kind for a in alerts]


def test_healthy_steps_raise_nothing():
    mon = HealthMonitor(HealthConfig())
    assert all(mon.check(s, GOOD) == [] for s in range(1, 30))


def test_nan_loss_or_grad_norm_fires_stop():
    mon = HealthMonitor(HealthConfig())
    [alert] = mon.check(1, {**GOOD, "grad_norm": math.inf})
    assert alert.kind == "nan" and alert.action == "stop" and "grad_norm" in alert.message
    assert _kinds(mon.check(2, {**GOOD, "loss": math.nan})) == ["nan"]


def test_entropy_collapse_kl_blowup_and_mismatch():
    mon = HealthMonitor(HealthConfig())
    assert _kinds(mon.check(1, {**GOOD, "entropy": 0.001})) == ["entropy_collapse"]
    assert _kinds(mon.check(2, {**GOOD, "kl": 5.0})) == ["kl_blowup"]
    assert _kinds(mon.check(3, {**GOOD, "train_infer_logprob_diff": 0.2})) == ["mismatch"]


def test_length_explosion_against_the_first_steps():
    mon = HealthMonitor(HealthConfig(warmup=3))
    for s in range(1, 4):
        assert mon.check(s, GOOD) == []
    assert mon.check(4, {**GOOD, "response_len_mean": 55.0}) == []  # 2.75x: under 3x
    assert _kinds(mon.check(5, {**GOOD, "response_len_mean": 61.0})) == ["length_explosion"]


def test_throughput_regression_against_moving_average():
    mon = HealthMonitor(HealthConfig(window=4, throughput_steps=1))
    for s in range(1, 5):
        assert mon.check(s, GOOD) == []
    assert _kinds(mon.check(5, {**GOOD, "gen_tokens_per_s": 100.0})) == ["throughput"]


def test_a_sustained_throughput_drop_alerts_once_until_it_recovers():
    """A shared machine: the rate stays low, jitters just under and over the line."""
    mon = HealthMonitor(HealthConfig(window=4))
    base = GOOD["gen_tokens_per_s"]
    alerts = []
    rates = [base] * 4 + [0.1 * base] * 6 + [0.32 * base, 0.25 * base] * 3
    rates += [base] * 4 + [0.1 * base] * 3  # recovered, then a second drop
    for step, rate in enumerate(rates, start=1):
        alerts += mon.check(step, {**GOOD, "gen_tokens_per_s": rate})
    # Each drop fires on its third slow step (health.throughput_steps = 3).
    assert [(a.kind, a.step) for a in alerts] == [("throughput", 7), ("throughput", 23)]


def test_reward_hacking_reward_up_while_heldout_flat():
    mon = HealthMonitor(HealthConfig())
    assert mon.observe_eval(0, accuracy=0.40) == []
    mon.check(1, {**GOOD, "reward_mean": 0.30})
    mon.check(20, {**GOOD, "reward_mean": 0.70})
    [alert] = mon.observe_eval(20, accuracy=0.38)
    assert alert.kind == "reward_hacking" and alert.value > 0.1
    # Reward and accuracy rising together is learning, not hacking.
    mon.check(40, {**GOOD, "reward_mean": 0.95})
    assert mon.observe_eval(40, accuracy=0.60) == []


def test_disabled_check_is_silent():
    cfg = HealthConfig(entropy_collapse=HealthCheck(enabled=False, threshold=0.5))
    assert HealthMonitor(cfg).check(1, {**GOOD, "entropy": 0.0}) == []


def test_stop_action_checkpoints_and_stops_a_real_run(tmp_path):
    # Every step has entropy below 100: the check fires at step 1 and stops the run.
    code = main(
        [
            "train",
            f"--run.output_dir={tmp_path}",
            "--run.name=h",
            "--orchestrator.steps=5",
            "--orchestrator.prompts_per_step=2",
            "--orchestrator.group_size=4",
            "--eval.at_start=false",
            "--eval.every=0",
            "--eval.size=4",
            "--eval.k=1",
            "--log.progress=false",
            "--health.entropy_collapse.threshold=100",
            "--health.entropy_collapse.action=stop",
        ]
    )
    assert code == 3  # stopped by a health check: not a success
    run = tmp_path / "h"
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1]
    events = [json.loads(x) for x in (run / "events.jsonl").read_text().splitlines()]
    alert = next(e for e in events if e["kind"] == "alert")
    assert alert["check"] == "entropy_collapse" and alert["action"] == "stop"
    assert any(e["kind"] == "stopped_by_health_check" for e in events)
    assert (run / "checkpoints" / "step_1" / "model.safetensors").is_file()


def _skip_run(root, name: str, steps: int, mismatch_threshold: float) -> tuple[list, dict, dict]:
    """A short real run whose mismatch check has action "skip"; returns its metrics,
    the shipped weights and the weights of its final checkpoint."""
    from safetensors.torch import load_file

    from temper.models import resolve_model_path

    code = main(
        [
            "train",
            f"--run.output_dir={root}",
            f"--run.name={name}",
            f"--orchestrator.steps={steps}",
            "--orchestrator.prompts_per_step=2",
            "--orchestrator.group_size=4",
            "--orchestrator.drop_zero_variance_groups=false",
            "--trainer.lr=1e-2",
            "--eval.at_start=false",
            "--eval.at_end=false",
            "--eval.every=0",
            "--log.progress=false",
            f"--health.mismatch.threshold={mismatch_threshold}",
            "--health.mismatch.action=skip",
            "--health.no_update.enabled=false",  # every update undone: "no update" is expected
        ]
    )
    assert code == 0
    run = root / name
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    shipped = load_file(str(resolve_model_path("tiny") / "model.safetensors"))
    final = load_file(str(run / "checkpoints" / f"step_{steps}" / "model.safetensors"))
    return metrics, shipped, final


def test_skip_action_undoes_each_update_of_a_real_run(tmp_path):
    # A train/inference mismatch above 0 fires on every step: each update is undone,
    # the engine keeps the shipped weights, and the run goes on to the end.
    metrics, shipped, final = _skip_run(tmp_path, "skip", steps=3, mismatch_threshold=0)
    assert [m["step"] for m in metrics] == [1, 2, 3]
    assert all(m["update_skipped"] == 1.0 and m["policy_version"] == 0 for m in metrics)
    events = [json.loads(x) for x in (tmp_path / "skip" / "events.jsonl").read_text().splitlines()]
    alerts = [e for e in events if e["kind"] == "alert"]
    assert [(a["step"], a["check"], a["action"]) for a in alerts] == [
        (s, "mismatch", "skip") for s in (1, 2, 3)
    ]
    assert all(torch.equal(final[name], shipped[name]) for name in shipped)


def test_skip_keeps_good_updates(tmp_path):
    # A skip check that never fires changes nothing: the weights move.
    metrics, shipped, final = _skip_run(tmp_path, "noskip", steps=1, mismatch_threshold=10)
    assert "update_skipped" not in metrics[0] and metrics[0]["policy_version"] == 1
    assert any(not torch.equal(final[name], shipped[name]) for name in shipped)


def test_learning_checks_fire_once_per_streak():
    mon = HealthMonitor(HealthConfig(no_update=HealthCheck(threshold=3, action="warn")))
    idle = {"groups_kept": 2, "groups_dropped": 0, "samples": 8, "reward_errors": 0}
    trained = {**idle, "loss": 0.1}
    fired = [_kinds(mon.check_learning(s, idle)) for s in range(1, 6)]
    assert fired == [[], [], ["no_update"], [], []]
    assert mon.check_learning(6, trained) == []
    assert mon.check_learning(7, {**trained, "update_skipped": 1.0}) == []


def test_reward_errors_above_the_share_fire():
    mon = HealthMonitor(HealthConfig())
    step = {"groups_kept": 1, "groups_dropped": 0, "loss": 0.1, "samples": 8}
    assert mon.check_learning(1, {**step, "reward_errors": 4}) == []  # 50%: not above
    [alert] = mon.check_learning(2, {**step, "reward_errors": 5})
    assert alert.kind == "reward_errors" and alert.action == "stop"
    assert "failed on 5 of 8 samples" in alert.message


def test_all_groups_dropped_over_the_whole_short_run():
    mon = HealthMonitor(HealthConfig())
    dropped = {"groups_kept": 0, "groups_dropped": 4, "samples": 16, "reward_errors": 0}
    assert mon.check_learning(1, dropped) == []
    [alert] = mon.check_learning(2, dropped, last=True)  # every step of the run: fires
    assert alert.kind == "all_groups_dropped" and "no learning signal" in alert.message


def test_no_update_is_not_checked_without_training():
    mon = HealthMonitor(HealthConfig())
    idle = {"groups_kept": 2, "groups_dropped": 0, "samples": 8, "reward_errors": 0}
    assert all(mon.check_learning(s, idle, trains=False) == [] for s in range(1, 30))
    assert mon.check_learning(30, idle, last=True, trains=False) == []


def test_infra_errors_stop_the_run_only_when_most_episodes_fail():
    mon = HealthMonitor(HealthConfig())
    blip = {"env/episodes": 16.0, "env/finish/infra_error": 2.0}
    assert mon.check(1, blip) == []
    gone = {"env/episodes": 16.0, "env/finish/infra_error": 12.0}
    (alert,) = mon.check(2, gone)
    assert (alert.kind, alert.action, alert.value) == ("infra_errors", "stop", 0.75)
    assert "12 of 16 episodes failed for the infrastructure" in alert.message
    assert mon.check(3, {"reward_mean": 0.5}) == []  # a run without env episodes


def test_episode_errors_stop_the_run_only_when_most_episodes_fail():
    mon = HealthMonitor(HealthConfig())
    base = {"groups_kept": 2, "groups_dropped": 0, "samples": 16, "reward_errors": 0, "loss": 0.1}
    assert mon.check_learning(1, {**base, "env/episodes": 16.0, "env/env_errors": 3.0}) == []
    alerts = mon.check_learning(2, {**base, "env/episodes": 16.0, "env/env_errors": 16.0})
    assert [(a.kind, a.action, a.value) for a in alerts] == [("episode_errors", "stop", 1.0)]
    assert "16 of 16 episodes ended in an error of their own" in alerts[0].message
    assert mon.check_learning(3, base) == []  # a run without episodes
