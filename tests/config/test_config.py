import pytest

from temper.config import dump_config, load_config
from temper.config.load import parse_override
from temper.errors import ConfigError


def test_defaults_are_the_embedded_demo_run():
    cfg = load_config()
    assert cfg.model.path == "tiny"
    assert cfg.data.type == "arithmetic"
    assert cfg.algo.advantage == "grpo"


def test_overrides_parse_toml_literals():
    cfg = load_config(None, ["trainer.lr=3e-4", "run.name=abc", "data.levels=[1, 2]"])
    assert cfg.trainer.lr == pytest.approx(3e-4)
    assert cfg.run.name == "abc"
    assert cfg.data.levels == [1, 2]
    assert parse_override("a.b=true") == (["a", "b"], True)


def test_unknown_key_names_the_field():
    with pytest.raises(ConfigError, match=r"unknown config key 'trainer\.lrr'"):
        load_config(None, ["trainer.lrr=1"])


def test_wrong_type_names_the_field_and_value():
    with pytest.raises(ConfigError, match=r"trainer\.lr: .*'abc'"):
        load_config(None, ["trainer.lr=abc"])


def test_bounds_are_enforced():
    with pytest.raises(ConfigError, match=r"orchestrator\.group_size"):
        load_config(None, ["orchestrator.group_size=0"])


def test_file_data_needs_path():
    with pytest.raises(ConfigError, match=r"data\.path is required"):
        load_config(None, ["data.type=file"])


def test_toml_file_round_trip(tmp_path):
    cfg = load_config(None, ["trainer.lr=2e-4", "orchestrator.steps=7"])
    path = tmp_path / "c.toml"
    path.write_text(dump_config(cfg))
    again = load_config(path)
    assert again == cfg


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[run\nname=1")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad)
