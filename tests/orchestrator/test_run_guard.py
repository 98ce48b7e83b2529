"""run_guard's parts on their own: error kinds, the once-per-kind report, Ctrl-C, start checks."""

import os
import signal
from pathlib import Path

import pytest

from temper.config import load_config
from temper.errors import ConfigError
from temper.orchestrator.run_dir import RunDir
from temper.orchestrator.run_guard import (
    ErrorReport,
    InterruptFlag,
    check_can_learn,
    error_kind,
    resume_message,
)
from temper.records import Trajectory


def _traj(error: str | None, task_id: str = "t") -> Trajectory:
    return Trajectory(task_id=task_id, group_id=0, prompt_ids=[1], response_ids=[2],
                      loss_mask=[1], behaviour_logprobs=[0.0], versions=[0], finish_reason="stop",
                      reward_error=error)  # fmt: skip


def test_error_kinds_ignore_exception_messages_and_numbers():
    a = "f: reward function 'f' raised KeyError: 'x1'"
    b = "f: reward function 'f' raised KeyError: 'other key'"
    c = "f: reward function 'f' raised ValueError: 'x1'"
    assert error_kind(a) == error_kind(b) != error_kind(c)
    assert error_kind("f: returned 3 values for 4 completion(s)") == error_kind(
        "f: returned 1 values for 2 completion(s)"
    )


def test_each_kind_is_reported_once_and_all_are_counted():
    report = ErrorReport()
    first = report.see(1, [_traj(None), _traj("f: raised KeyError: 'a'", "t1"),
                           _traj("f: raised KeyError: 'b'"), _traj("f: returned nan")])  # fmt: skip
    assert [(e["sample"], e["task_id"]) for e in first] == [(1, "t1"), (3, "t")]
    assert "sample 1 (task t1): f: raised KeyError: 'a'" in report.line(first[0])
    assert report.see(2, [_traj("f: raised KeyError: 'c'")]) == []  # seen kind: counted only
    assert sum(report.counts.values()) == 4
    assert report.summary().startswith("reward errors: 4 in this run: 3 x f: raised KeyError")


def test_episode_errors_are_reported_once_per_kind_and_infra_failures_are_not():
    def episode(error: str | None, finish: str = "agent_error") -> Trajectory:
        traj = _traj(None, "t9")
        traj.env_error, traj.finish_reason = error, finish
        return traj

    report = ErrorReport(episodes=True)
    trajs = [episode(None, "stop"), episode("env server lost", "infra_error"),
             episode("agent returned 'yes' (str), not a number or None"),
             episode("agent returned 'yes' (str), not a number or None")]  # fmt: skip
    [event] = report.see(3, trajs)
    assert event["kind"] == "episode_error" and event["sample"] == 2
    line = report.line(event)
    assert line.startswith("episode error at step 3, sample 2 (task t9): agent returned 'yes'")
    assert "env/env_errors" in line
    assert sum(report.counts.values()) == 2  # the infrastructure's failure is not counted


def test_group_size_one_is_refused_unless_nothing_trains():
    with pytest.raises(ConfigError, match="group_size = 1 cannot learn"):
        check_can_learn(load_config(None, ["orchestrator.group_size=1"]))
    check_can_learn(
        load_config(None, ["orchestrator.group_size=1", "orchestrator.mode=rollout_only"])
    )


def test_turn_credit_is_refused_for_an_estimator_without_a_per_turn_form():
    cfg = load_config(None, ["env.type=guess_number", "algo.credit=turn"])
    check_can_learn(cfg)  # grpo has one
    # An estimator added to algo.advantage later (model_copy skips validation, as a
    # merged Literal would) is refused at start, not at the first step.
    other = cfg.model_copy(update={"algo": cfg.algo.model_copy(update={"advantage": "new"})})
    with pytest.raises(ConfigError, match=r"no per-turn form of algo\.advantage = 'new'"):
        check_can_learn(other)


def test_an_async_resume_says_what_it_does_not_keep():
    run = RunDir(Path("runs/x"), resume_from=Path("runs/x/checkpoints/step_4"))
    sync = resume_message(run, 4, load_config(None, []))
    assert sync == "resuming from step 4 (runs/x/checkpoints/step_4)"
    cfg = load_config(None, ["orchestrator.max_staleness=2"])
    assert "groups that were in flight or buffered at the checkpoint are not kept" in (
        resume_message(run, 4, cfg)
    )
    assert resume_message(RunDir(Path("runs/y")), 0, cfg) is None


def test_first_ctrl_c_asks_to_stop_the_second_quits():
    flag = InterruptFlag()
    before = signal.getsignal(signal.SIGINT)
    with flag:
        os.kill(os.getpid(), signal.SIGINT)
        assert flag.requested
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is before
