"""Hostile config files and overrides: every problem is a one-line ConfigError (the CLI's
`temper: error:` and exit 2), never a traceback. Property-based with hypothesis."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from temper.cli.main import main
from temper.config import load_config
from temper.config.schema import Config
from temper.errors import ConfigError

HUGE_INT = "9" * 5000

BAD_FILES = {
    "invalid_utf8": b'[run]\nname = "caf\xe9"\n',
    "utf16_bom": "[run]\nname = 'x'\n".encode("utf-16"),
    "deep_array": b"[run]\nname = " + b"[" * 5000 + b"]" * 5000 + b"\n",
    "deep_inline_table": b"[env]\noptions = " + b"{a = " * 3000 + b"1" + b"}" * 3000 + b"\n",
    "nested_beyond_limit": b"[env]\noptions = {a = " + b"[" * 80 + b"]" * 80 + b"}\n",
    "huge_int": b"[orchestrator]\nsteps = " + HUGE_INT.encode() + b"\n",
    "surrogate_escape": b'[run]\nname = "\\ud800"\n',
    "nul_byte": b"[run]\nname = 'a\x00b'\n",
}

BAD_OVERRIDES = {
    "deep_array": "env.options.x=" + "[" * 5000 + "]" * 5000,
    "deep_inline_table": "env.options.x=" + "{a = " * 3000 + "1" + "}" * 3000,
    "nested_beyond_limit": "env.options.x=" + "[" * 80 + "]" * 80,
    "huge_int": f"orchestrator.steps={HUGE_INT}",
    "huge_int_in_options": f"env.options.x={HUGE_INT}",
    "long_int_wrong_field": "trainer.lr=" + "7" * 4000,
    "deep_key": "env.options." + ".".join(["k"] * 200) + "=1",
    "surrogate_value": "run.name=caf\udce9",  # argv bytes that are not UTF-8
    "surrogate_key": "run.n\udce9me=x",
    "empty_key_part": "run..name=x",
}


@pytest.mark.parametrize("name", sorted(BAD_FILES))
def test_bad_config_file_is_a_config_error(tmp_path, name):
    path = tmp_path / "c.toml"
    path.write_bytes(BAD_FILES[name])
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert "\n" not in message and len(message) < 400 and str(path) in message


@pytest.mark.parametrize("name", sorted(BAD_OVERRIDES))
def test_bad_override_is_a_config_error(name):
    with pytest.raises(ConfigError) as info:
        load_config(None, [BAD_OVERRIDES[name]])
    message = str(info.value)
    assert "\n" not in message and len(message) < 400


def test_unreadable_config_file_is_a_config_error(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text("[run]\nname = 'x'\n")
    path.chmod(0)
    if os.access(path, os.R_OK):  # root reads anything
        pytest.skip("running as root: the file stays readable")
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(path)


@pytest.mark.parametrize("name", ["invalid_utf8", "deep_array", "huge_int"])
def test_cli_prints_one_line_and_exits_2_for_a_bad_file(tmp_path, capsys, name):
    path = tmp_path / "c.toml"
    path.write_bytes(BAD_FILES[name])
    assert main(["train", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("temper: error: ")


@pytest.mark.parametrize("name", ["deep_array", "huge_int", "surrogate_value"])
def test_cli_prints_one_line_and_exits_2_for_a_bad_override(capsys, name):
    assert main(["train", f"--{BAD_OVERRIDES[name]}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("temper: error: ")


def test_a_config_path_too_long_for_the_file_system_is_a_config_error():
    with pytest.raises(ConfigError, match="File name too long"):
        load_config("x" * 5000 + ".toml")


def test_a_long_bad_value_is_shortened_in_the_message():
    with pytest.raises(ConfigError) as info:
        load_config(None, ["orchestrator.steps=" + "'" + "x" * 5000 + "'"])
    assert "orchestrator.steps" in str(info.value) and len(str(info.value)) < 400


# ----------------------------------------------------------------------- properties

_sections = st.sampled_from(
    ["run.name", "trainer.lr", "orchestrator.steps", "env.options", "data.levels", "x.y", "run"]
)
_raw_values = st.one_of(
    st.text(max_size=30),
    st.lists(
        st.sampled_from(["[", "]", "{", "}", "=", ",", '"', "'", "1", "1e999", "inf", "nan",
                         "true", "a", " ", "\\", "\\ud800", HUGE_INT[:60], "0x", "1979-05-27"]),
        max_size=30,
    ).map("".join),
)  # fmt: skip
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))


@FUZZ
@given(st.lists(st.tuples(_sections, _raw_values), max_size=3))
def test_property_overrides_give_a_config_or_a_config_error(pairs):
    try:
        cfg = load_config(None, [f"{k}={v}" for k, v in pairs])
    except ConfigError as exc:
        assert "\n" not in str(exc)
    else:
        assert isinstance(cfg, Config)


@FUZZ
@given(st.binary(max_size=200) | _raw_values.map(lambda t: f"[run]\nname = {t}\n".encode()))
def test_property_files_give_a_config_or_a_config_error(tmp_path_factory, content):
    path = tmp_path_factory.mktemp("cfg") / "c.toml"
    path.write_bytes(content)
    try:
        cfg = load_config(path)
    except ConfigError as exc:
        assert "\n" not in str(exc)
    else:
        assert isinstance(cfg, Config)
