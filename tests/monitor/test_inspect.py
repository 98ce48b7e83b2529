"""`temper inspect` and `temper compare` over real run directories."""

import json
from pathlib import Path

import pytest

from temper.cli.main import main


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("runs")
    for name, lr in (("a", "1e-4"), ("b", "3e-4")):
        code = main(
            [
                "train",
                f"--run.output_dir={root}",
                f"--run.name={name}",
                f"--trainer.lr={lr}",
                "--orchestrator.steps=2",
                "--orchestrator.prompts_per_step=2",
                "--orchestrator.group_size=4",
                "--eval.every=0",
                "--eval.size=4",
                "--eval.k=2",
                "--log.progress=false",
                "--log.trajectories_per_step=8",
            ]
        )
        assert code == 0
    return root


def test_inspect_ranks_samples_by_reward(two_runs, capsys):
    assert main(["inspect", str(two_runs / "a"), "--step", "2", "--k", "2"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("step 2: 8 saved samples")
    records = [
        json.loads(x)
        for x in (two_runs / "a" / "trajectories" / "step_000002.jsonl").read_text().splitlines()
    ]
    best = max(r["reward"] for r in records)
    worst = min(r["reward"] for r in records)
    best_block, worst_block = out.split("-- best\n")[1].split("-- worst\n")
    assert best_block.startswith(f"reward {best:+.3f}")
    assert worst_block.startswith(f"reward {worst:+.3f}")


def test_inspect_shows_each_samples_prompt_and_target(two_runs, capsys):
    assert main(["inspect", str(two_runs / "a"), "--step", "1", "--k", "8"]) == 0
    out = capsys.readouterr().out
    records = [
        json.loads(x)
        for x in (two_runs / "a" / "trajectories" / "step_000001.jsonl").read_text().splitlines()
    ]
    prompts = [line for line in out.splitlines() if line.startswith("    prompt:")]
    targets = [line for line in out.splitlines() if line.startswith("    target:")]
    assert len(prompts) == len(targets) == 16  # 8 best and 8 worst
    # Arithmetic tasks: the prompt asks "What is a + b?" and the target is the sum.
    for record in records:
        a, b = record["task_id"].split("-")[-1].split("+")
        assert record["answer"] == str(int(a) + int(b))
        assert f"    target:   {record['answer']}" in targets
        assert any(f"What is {a} + {b}?" in p for p in prompts)


def test_inspect_without_step_lists_every_saved_step(tmp_path, capsys):
    run = tmp_path / "r"
    (run / "trajectories").mkdir(parents=True)
    (run / "metrics.jsonl").write_text("")
    for step in [*range(1, 13), 20]:
        record = {"task_id": f"t{step}", "reward": 1.0 if step % 2 else 0.0, "correct": step % 2}
        path = run / "trajectories" / f"step_{step:06d}.jsonl"
        path.write_text(json.dumps(record) + "\n")
    assert main(["inspect", str(run)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "13 saved step(s): 1-12, 20"
    assert [line.split()[1] for line in out[1:]] == [*map(str, range(1, 13)), "20"]
    assert "reward mean +1.000  correct 1/1" in out[1]
    assert main(["inspect", str(run), "--step", "13"]) == 2
    assert "saved steps: 1-12, 20" in capsys.readouterr().err


def test_inspect_missing_step_is_one_line(two_runs, capsys):
    assert main(["inspect", str(two_runs / "a"), "--step", "9"]) == 2
    err = capsys.readouterr().err
    assert "no trajectories saved at step 9; saved steps: 1-2" in err


def test_compare_shows_metrics_and_the_config_diff(two_runs, capsys):
    assert main(["compare", str(two_runs / "a"), str(two_runs / "b")]) == 0
    out = capsys.readouterr().out
    assert "reward_mean" in out and "final eval accuracy" in out
    assert "trainer.lr: 0.0001 vs 0.0003" in out
    assert "run.name: 'a' vs 'b'" in out
    assert main(["compare", str(two_runs / "a"), str(two_runs / "nope")]) == 2
