"""End to end: a multi-turn env run trains, evaluates, and replays from its run directory."""

import json
from pathlib import Path

import pytest

from env_servers import ServerThread
from temper.cli.main import main

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_tool_use_run_trains_and_its_episodes_replay(tmp_path, capsys):
    code = main(
        [
            "train",
            str(ROOT / "configs" / "tool_use.toml"),
            f"--run.output_dir={tmp_path}",
            "--orchestrator.steps=2",
            "--orchestrator.prompts_per_step=4",
            "--orchestrator.group_size=4",
            "--env.options.eval_size=8",
            "--eval.every=0",
            "--eval.k=2",
            "--log.progress=false",
            "--log.trajectories_per_step=16",
        ]
    )
    assert code == 0
    run = tmp_path / "tool_use"
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    assert metrics[0]["env/episodes"] == 16
    assert "env/turns_mean" in metrics[0] and "accuracy" in metrics[0]
    evals = json.loads((run / "eval" / "step_000002.json").read_text())
    assert evals["n_tasks"] == 8 and set(evals["by_category"]) <= {
        "calc", "lookup", "lookup_calc", "python"
    }  # fmt: skip
    lines = (run / "trajectories" / "step_000002.jsonl").read_text().splitlines()
    record = json.loads(lines[0])
    assert record["task"]["id"] == record["task_id"] and record["episode_seed"] is not None
    # Observation tokens are never trained on.
    assert sum(record["loss_mask"]) < len(record["response_ids"]) or record["num_turns"] == 1
    capsys.readouterr()
    step_file = run / "trajectories" / "step_000002.jsonl"
    assert main(["replay", str(step_file)]) == 0
    assert f"replayed {len(lines)} episode(s)" in capsys.readouterr().out
    # The same episodes on an env server: hermetic across the wire.
    with ServerThread("tool_use", {"eval_size": 8}) as server:
        assert main(["replay", str(step_file), "--servers", server.url]) == 0
        out = capsys.readouterr().out
        assert f"replayed {len(lines)} episode(s)" in out and f"on {server.url}: 0 differ" in out
        assert server.service.counts["sessions_opened"] == len(lines)

        # A tampered recording is caught, in process and on the server.
        record["turn_rewards"] = [r + 1 for r in record["turn_rewards"]]
        bad = run / "trajectories" / "step_999999.jsonl"
        bad.write_text(json.dumps(record) + "\n")
        assert main(["replay", str(bad), "--in-process"]) == 1
        assert "differ" in capsys.readouterr().out
        assert main(["replay", str(bad), "--servers", server.url]) == 1
        assert "1 differ" in capsys.readouterr().out
    # A server of another env refuses this run's episodes: exit 2, one line.
    with ServerThread() as other:
        assert main(["replay", str(step_file), "--servers", other.url]) == 2
        err = capsys.readouterr().err
        assert "env_mismatch" in err and len(err.strip().splitlines()) == 1


def test_replay_refuses_single_turn_runs_and_missing_files(tmp_path, capsys):
    assert main(["replay", str(tmp_path / "nope.jsonl")]) == 2
    assert "does not exist" in capsys.readouterr().err
