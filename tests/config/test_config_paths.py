"""Relative paths in a config file are read against that file's folder."""

import tomllib
from pathlib import Path

from temper.cli.main import main
from temper.config import load_config
from temper.config.load import MODEL_ALIASES

CONFIG = """
[model]
path = "{model}"
[data]
type = "file"
path = "data/train.jsonl"
eval_path = "../shared/test.jsonl"
[env]
type = "my_env.py:make"
[orchestrator]
train_from = "old/trajectories"
[sft]
source = "file"
path = "data/chats.jsonl"
[[reward.components]]
type = "python"
function = "rewards/mine.py:score"
[[reward.components]]
type = "python"
function = "my_package.rewards:score"
"""


def _write(tmp_path: Path, model: str = "tiny") -> Path:
    cfg = tmp_path / "project" / "cfg.toml"
    cfg.parent.mkdir()
    cfg.write_text(CONFIG.format(model=model))
    return cfg


def test_paths_in_a_file_resolve_against_its_folder(tmp_path, monkeypatch):
    cfg_path = _write(tmp_path, model="models/small")
    monkeypatch.chdir(tmp_path)  # elsewhere than the file
    cfg = load_config("project/cfg.toml")
    here = cfg_path.parent
    assert cfg.data.path == str(here / "data" / "train.jsonl")
    assert cfg.data.eval_path == str(tmp_path / "shared" / "test.jsonl")
    assert cfg.model.path == str(here / "models" / "small")
    assert cfg.env.type == f"{here / 'my_env.py'}:make"
    assert cfg.orchestrator.train_from == str(here / "old" / "trajectories")
    assert cfg.sft.path == str(here / "data" / "chats.jsonl")
    functions = [c.function for c in cfg.reward.components]
    assert functions == [f"{here / 'rewards' / 'mine.py'}:score", "my_package.rewards:score"]
    assert cfg.run.output_dir == "runs"  # stays relative to the working directory


def test_built_in_names_absolute_paths_and_overrides(tmp_path, monkeypatch):
    _write(tmp_path)
    monkeypatch.chdir(tmp_path)
    cfg = load_config("project/cfg.toml", ["data.eval_path=/abs/test.jsonl"])
    assert cfg.model.path == "tiny"
    assert cfg.data.eval_path == "/abs/test.jsonl"
    # An override's relative path is relative to where the command runs.
    cfg = load_config("project/cfg.toml", ["data.path=here.jsonl", "env.type=code"])
    assert cfg.data.path == str(tmp_path / "here.jsonl")
    assert cfg.env.type == "code"


def test_model_aliases_match_the_loader():
    from temper.models.loader import ALIASES

    assert set(ALIASES) == MODEL_ALIASES


def test_config_show_prints_the_resolved_config(tmp_path, monkeypatch, capsys):
    _write(tmp_path)
    monkeypatch.chdir(tmp_path)
    assert main(["config", "show", "project/cfg.toml", "--trainer.lr", "1e-5"]) == 0
    shown = tomllib.loads(capsys.readouterr().out)
    assert shown["trainer"]["lr"] == 1e-5
    assert shown["data"]["path"] == str(tmp_path / "project" / "data" / "train.jsonl")
    assert shown["orchestrator"]["steps"] == load_config().orchestrator.steps  # a default


def test_config_show_names_a_bad_key(capsys):
    assert main(["config", "show", "--trainer.nope=1"]) == 2
    assert "unknown config key 'trainer.nope'" in capsys.readouterr().err
