"""`temper eval --checkpoint runs/X/checkpoints/step_N` evaluates on run X's own config."""

import json
import shutil

from temper.cli.main import main
from temper.models.loader import TINY_DIR

RUN_CONFIG = """
[run]
name = "x"
[data]
type = "file"
path = "train.jsonl"
category_field = "topic"
eval_size = 3
[[reward.components]]
type = "exact"
[eval]
k = 1
max_response_tokens = 8
"""


def _run_dir(tmp_path):
    """A run directory as training leaves it: config.toml and a checkpoint (the tiny model)."""
    rows = [{"prompt": f"Say {w}.", "answer": w, "topic": "words"} for w in "abcdefgh"]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = tmp_path / "runs" / "x"
    shutil.copytree(TINY_DIR, run / "checkpoints" / "step_2")
    # Written relative to where training ran, as runs before absolute paths were.
    (run / "config.toml").write_text(RUN_CONFIG)
    return run


def test_eval_of_a_checkpoint_uses_its_runs_data_and_reward(tmp_path, monkeypatch, capsys):
    run = _run_dir(tmp_path)
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "eval.json"
    code = main(["eval", "--checkpoint", "runs/x/checkpoints/step_2", f"--out={out}"])
    assert code == 0, capsys.readouterr().err
    result = json.loads(out.read_text())
    # The run's held-out rows (at most its eval_size), not the default's arithmetic.
    assert 1 <= result["n_tasks"] <= 3
    assert set(result["by_category"]) == {"words"}
    assert result["model"] == str(run / "checkpoints" / "step_2")
    assert "runs/x/config.toml" in capsys.readouterr().err


def test_an_explicit_config_still_wins(tmp_path, monkeypatch):
    _run_dir(tmp_path)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "default.toml").write_text("")  # the built-in arithmetic run
    out = tmp_path / "eval.json"
    argv = ["eval", "default.toml", "--checkpoint", "runs/x/checkpoints/step_2"]
    assert (
        main([*argv, "--eval.size=2", "--eval.k=1", "--eval.max_response_tokens=8", f"--out={out}"])
        == 0
    )
    result = json.loads(out.read_text())
    assert result["n_tasks"] == 2 and "words" not in result["by_category"]
