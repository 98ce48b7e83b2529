"""Load a Config from TOML presets and dotted command-line overrides.

`load_config("configs/x.toml", ["trainer.lr=3e-4"])` reads the file, applies
each override (the value is parsed as a TOML literal, falling back to a plain
string), validates, and raises `ConfigError` with one line that names the
offending field on any problem.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import tomli_w
from pydantic import ValidationError

from temper.config.schema import Config
from temper.errors import ConfigError


def parse_override(text: str) -> tuple[list[str], Any]:
    """Split `a.b.c=value` into (["a","b","c"], parsed value)."""
    key, sep, raw = text.partition("=")
    key = key.strip().lstrip("-")
    if not sep or not key:
        raise ConfigError(f"override {text!r} is not of the form section.key=value")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return key.split("."), value


def apply_override(data: dict[str, Any], path: list[str], value: Any) -> None:
    node = data
    for part in path[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {'.'.join(path)}: {part!r} is not a section")
        node = child
    node[path[-1]] = value


def format_validation_error(err: ValidationError) -> str:
    """One line per problem, naming the dotted field."""
    parts = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "config"
        if e["type"] == "extra_forbidden":
            parts.append(f"unknown config key '{loc}'")
        else:
            got = e.get("input")
            shown = "" if isinstance(got, dict) else f" (got {got!r})"
            parts.append(f"{loc}: {e['msg']}{shown}")
    return "; ".join(parts)


def config_from_dict(data: dict[str, Any]) -> Config:
    try:
        return Config.model_validate(data)
    except ValidationError as err:
        raise ConfigError(f"invalid config: {format_validation_error(err)}") from None


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Read `path` (or the embedded default when None) and apply `overrides`."""
    data: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file not found: {p}")
        try:
            data = tomllib.loads(p.read_text())
        except tomllib.TOMLDecodeError as err:
            raise ConfigError(f"config file {p} is not valid TOML: {err}") from None
    for text in overrides or []:
        keys, value = parse_override(text)
        apply_override(data, keys, value)
    return config_from_dict(data)


def dump_config(cfg: Config) -> str:
    """The resolved config as TOML (None values are omitted: TOML has no null)."""
    return tomli_w.dumps(cfg.model_dump(mode="json", exclude_none=True))
