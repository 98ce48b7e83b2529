"""Start-up: a config error comes before torch and transformers load; a response limit
longer than the model's context is refused; transformers' progress bars stay off
unless asked for."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from temper.cli.main import VERBOSE_ENV, main
from temper.errors import ConfigError

TYPO = "[trainer]\nlerning_rate = 1e-4\n"


def _python(code: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, **(env or {})},
        timeout=300,
        check=False,
    )


def test_a_config_error_comes_before_torch_is_imported(tmp_path):
    """`temper train` and `temper eval` check the config first: the error is printed and
    the command returns 2 with neither torch nor transformers imported."""
    (tmp_path / "typo.toml").write_text(TYPO)
    proc = _python(
        """
        import sys
        from temper.cli.main import main
        codes = [main(["train", "typo.toml"]), main(["eval", "typo.toml"]),
                 main(["train", "--orchestrator.steps=zero"])]
        heavy = [m for m in ("torch", "transformers", "temper.orchestrator.loop") if m in sys.modules]
        print(codes, heavy)
        """,
        tmp_path,
    )
    assert proc.stdout.strip() == "[2, 2, 2] []", proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 3 and all(line.startswith("temper: error: ") for line in lines)
    assert (
        lines[0]
        == lines[1]
        == (
            "temper: error: invalid config: unknown config key 'trainer.lerning_rate' "
            "(did you mean 'lr'?)"
        )
    )
    assert "orchestrator.steps" in lines[2]


def test_unknown_key_gets_a_close_match_through_the_command(capsys):
    assert main(["train", "--run.nmae=demo"]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert (
        line
        == "temper: error: invalid config: unknown config key 'run.nmae' (did you mean 'name'?)"
    )


def test_response_limit_past_the_context_is_refused(capsys, tmp_path):
    """The tiny model's context is 512 tokens: a 512-token response leaves no room for
    the prompt. One line naming both numbers, exit 2, no run directory left."""
    code = main(
        [
            "train",
            f"--run.output_dir={tmp_path}",
            "--orchestrator.max_response_tokens=512",
            "--log.progress=false",
        ]
    )
    [line] = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert line == (
        "temper: error: orchestrator.max_response_tokens = 512 does not fit the model's "
        "context of 512 tokens (the prompt needs at least one): set it below 512"
    )
    assert not (tmp_path / "demo").exists()


def test_eval_response_limit_past_the_context_is_refused(capsys):
    assert main(["eval", "--eval.max_response_tokens=4096", "--eval.size=2"]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert "eval.max_response_tokens = 4096" in line and "context of 512 tokens" in line


def test_check_response_fits_names_the_key_and_both_numbers():
    from temper.builder.engines import check_response_fits

    check_response_fits({"orchestrator.max_response_tokens": 511}, 512)  # one prompt token left
    check_response_fits({"eval.max_response_tokens": None}, 512)  # not set: nothing to check
    with pytest.raises(ConfigError, match=r"eval.max_response_tokens = 600 .* context of 512"):
        check_response_fits({"eval.max_response_tokens": 600}, 512)


LOAD = """
    from temper.builder.model import load_run_model
    from temper.config import config_from_dict
    from temper.models import load_model

    model = load_run_model(config_from_dict({}))
    load_model(model.weights)
    print("loaded")
    """


def test_model_loading_shows_no_progress_bars_unless_verbose(tmp_path):
    """`load_run_model` (the CLI, the Python API and every builder go through it) turns
    transformers' "Loading weights" bar off; TEMPER_VERBOSE=1 (`--verbose`) keeps it."""
    quiet = _python(LOAD, tmp_path, {VERBOSE_ENV: ""})
    assert quiet.stdout.strip() == "loaded", quiet.stderr[-2000:]
    assert "Loading weights" not in quiet.stderr
    verbose = _python(LOAD, tmp_path, {VERBOSE_ENV: "1"})
    assert verbose.stdout.strip() == "loaded", verbose.stderr[-2000:]
    assert "Loading weights" in verbose.stderr


def test_verbose_flag_sets_the_variable_the_builder_reads(monkeypatch, capsys):
    from temper.builder import model

    assert model.VERBOSE_ENV == VERBOSE_ENV
    monkeypatch.delenv(VERBOSE_ENV, raising=False)
    assert main(["train", "--trainer.zzz=1"]) == 2  # fails on the config, after the flag
    assert VERBOSE_ENV not in os.environ
    assert main(["train", "--verbose", "--trainer.zzz=1"]) == 2
    assert os.environ[VERBOSE_ENV] == "1"
    capsys.readouterr()
