"""`temper --version`, `python -m temper`, and help that documents every flag."""

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

import temper
from temper.cli.main import _parser, main
from temper.config.doc import section_models
from temper.config.schema import Config

SRC = Path(__file__).resolve().parents[2] / "src"


def test_python_dash_m_temper_prints_the_version():
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    done = subprocess.run(
        [sys.executable, "-m", "temper", "--version"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"temper {temper.__version__}"


def test_train_help_lists_every_config_key_with_examples(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    with pytest.raises(SystemExit) as exit_:
        main(["train", "--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    assert "temper train configs/arithmetic_grpo.toml --trainer.lr=3e-4" in text
    listing = text.split("keys by section:")[1]
    for section, field in Config.model_fields.items():
        assert f"  {section}." in listing
        for model in section_models(field.annotation):  # engine: every type's keys
            for key in model.model_fields:
                assert key in listing, f"{section}.{key} missing from train --help"
    assert "kv_cache_gb" in listing and "base_url" in listing
    assert all(len(line) <= 80 for line in text.splitlines())


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = _parser()
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


@pytest.mark.parametrize("command", sorted(_subparsers()))
def test_every_flag_has_help_and_shows_its_default(command, capsys):
    parser = _subparsers()[command]
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        assert action.help, f"temper {command} {action.dest} has no help text"
    text = parser.format_help()
    for action in parser._actions:
        if action.option_strings and action.default not in (None, False, argparse.SUPPRESS):
            assert f"(default: {action.default})" in " ".join(text.split()), (
                f"temper {command} {action.option_strings[0]} does not show its default"
            )
