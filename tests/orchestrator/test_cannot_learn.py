"""A run that cannot learn says so: real `temper train` runs on the tiny model.

A reward that fails everywhere, or that never separates the samples of a group,
stops the run with a one-line reason, exit code 3 and the reason in
events.jsonl; configs that can never learn are refused before any work.
"""

import json
from pathlib import Path

import pytest

from quick_run import exit_code

SHORT = [
    "--orchestrator.steps=2",
    "--orchestrator.prompts_per_step=2",
    "--orchestrator.group_size=4",
    "--orchestrator.max_response_tokens=16",
    "--log.trajectories_per_step=0",
]


def _train(tmp_path: Path, name: str, *extra: str) -> int:
    return exit_code(tmp_path, name, *SHORT, *extra)


def _reward_file(tmp_path: Path, body: str) -> str:
    path = tmp_path / "my_reward.py"
    path.write_text(body)
    return f"{path}:reward"


def _python_reward(spec: str) -> list[str]:
    return [
        # No spaces: argparse takes an argument with a space for the CONFIG file.
        '--reward.components=[{type="python",function="' + spec + '"}]',
        "--reward.filters=[]",
    ]


def _events(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "events.jsonl").read_text().splitlines()]


def test_a_reward_that_always_raises_stops_the_run_and_says_why(tmp_path, capsys):
    spec = _reward_file(
        tmp_path,
        "def reward(prompts, completions, **kw):\n    raise ValueError('no verifier for this')\n",
    )
    code = _train(tmp_path, "raises", *_python_reward(spec))
    err = capsys.readouterr().err
    assert code == 3
    # Reported once per kind, with type, message and the sample's index; then the reason.
    shown = [line for line in err.splitlines() if line.startswith("reward error at")]
    assert len(shown) == 1
    assert "step 1, sample 0" in shown[0]
    assert "raised ValueError: no verifier for this" in shown[0]
    assert err.strip().splitlines()[-1] == (
        "temper: error: run stopped at step 1 by health check reward_errors: the reward failed "
        "on 8 of 8 samples (> 50%); see the reward errors above"
    )
    events = _events(tmp_path / "raises")
    stop = next(e for e in events if e["kind"] == "stopped_by_health_check")
    assert stop["check"] == "reward_errors" and "failed on 8 of 8" in stop["reason"]
    assert [e["sample"] for e in events if e["kind"] == "reward_error"] == [0]


def test_nan_rewards_are_errors_not_rewards(tmp_path, capsys):
    spec = _reward_file(
        tmp_path, "def reward(completions, **kw):\n    return [float('nan')] * len(completions)\n"
    )
    assert _train(tmp_path, "nanrun", *_python_reward(spec)) == 3
    err = capsys.readouterr().err
    assert "returned nan; expected a finite number or None" in err
    metrics = json.loads((tmp_path / "nanrun" / "metrics.jsonl").read_text().splitlines()[0])
    assert metrics["reward_errors"] == 8 and metrics["reward_mean"] == 0.0


def test_a_reward_that_never_separates_samples_stops_the_run(tmp_path, capsys):
    # Every sample scores 1: every group has zero variance and is dropped: no update.
    spec = _reward_file(
        tmp_path, "def reward(completions, **kw):\n    return [1.0] * len(completions)\n"
    )
    assert _train(tmp_path, "flat", *_python_reward(spec)) == 3
    err = capsys.readouterr().err
    assert "health check all_groups_dropped: every group was dropped in the last 2 step(s)" in err
    assert any(e.get("check") == "all_groups_dropped" for e in _events(tmp_path / "flat"))


def test_group_size_one_is_refused_before_any_work(tmp_path, capsys):
    assert _train(tmp_path, "g1", "--orchestrator.group_size=1") == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("temper: error: orchestrator.group_size = 1 cannot learn")
    assert len(err.splitlines()) == 1
    assert not (tmp_path / "g1").exists()


def test_a_reward_signature_is_checked_before_the_first_eval(tmp_path, capsys):
    spec = _reward_file(
        tmp_path, "def reward(completions, rubric):\n    return [0.0] * len(completions)\n"
    )
    code = _train(tmp_path, "sig", *_python_reward(spec), "--eval.at_start=true")
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert "reward function 'reward' needs argument(s) ['rubric']" in err
    assert not (tmp_path / "sig").exists()  # no step-0 eval ran, nothing was written


@pytest.mark.parametrize("backend", ["local", "process"])
def test_trl_reward_functions_get_what_trl_passes(tmp_path, backend):
    # completion_ids, trainer_state.global_step and the category, as TRL's GRPOTrainer passes.
    log = tmp_path / "seen.jsonl"
    spec = _reward_file(
        tmp_path,
        "import json\n"
        "def reward(prompts, completions, completion_ids, trainer_state, category, **kw):\n"
        f"    with open({str(log)!r}, 'a') as f:\n"
        "        f.write(json.dumps({'step': trainer_state.global_step, 'ids': completion_ids,\n"
        "                            'category': category}) + '\\n')\n"
        "    return [float(len(ids) % 2) for ids in completion_ids]\n",
    )
    code = _train(tmp_path, "trl", *_python_reward(spec), "--health.no_update.enabled=false",
                  "--health.all_groups_dropped.enabled=false",
                  f"--orchestrator.backend={backend}", "--orchestrator.rollout_workers=1")  # fmt: skip
    assert code == 0
    calls = [json.loads(x) for x in log.read_text().splitlines()]
    # Steps completed when scored, as in TRL (rollout workers score one group per call).
    steps = [c["step"] for c in calls]
    assert steps == sorted(steps) and sorted(set(steps)) == [0, 1]
    for step in (0, 1):
        assert sum(len(c["ids"]) for c in calls if c["step"] == step) == 8
    for call in calls:
        assert all(isinstance(i, int) for ids in call["ids"] for i in ids)
        assert all(c.startswith("level") for c in call["category"])
