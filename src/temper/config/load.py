"""Load a Config from TOML presets and dotted command-line overrides.

`load_config("configs/x.toml", ["trainer.lr=3e-4"])` reads the file, makes its
relative paths absolute against the file's folder (`resolve_paths`), applies
each override (the value is parsed as a TOML literal, falling back to a plain
string), validates, and raises `ConfigError` with one line that names the
offending field on any problem. That includes hostile input: a file that is
not UTF-8 or cannot be read, values nested deeper than `MAX_DEPTH` (which
Python's TOML parser would answer with `RecursionError`), integers over
Python's 4,300-digit limit (`ValueError`), text that is not valid Unicode
(command-line bytes that are not UTF-8), and keys nested too deep.
"""

from __future__ import annotations

import difflib
import os
import tomllib
from pathlib import Path
from typing import Any

import tomli_w
from pydantic import BaseModel, ValidationError

from temper import safe_json
from temper.config.doc import section_models
from temper.config.schema import Config
from temper.errors import ConfigError

#: Deepest nesting of a config value or dotted key (far beyond any real config;
#: deeper values would strain the recursive code that reads and writes configs).
MAX_DEPTH = 32


def _parse_toml(text: str, where: str) -> dict[str, Any]:
    """``tomllib.loads`` with every failure as one line naming ``where``."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{where} is not valid TOML: {err}") from None
    except RecursionError:
        raise ConfigError(f"{where} nests values deeper than {MAX_DEPTH} levels") from None
    except ValueError as err:  # tomllib lets int()'s digit limit through
        raise ConfigError(f"{where} is not usable: {_first_line(err)}") from None
    for value in data.values():  # a section table is level one
        _check_value(value, where)
    return data


def _check_value(value: Any, where: str) -> None:
    try:
        safe_json.check_value(value, MAX_DEPTH, finite=False)
    except safe_json.JSONInputError as err:
        if "surrogate" in str(err):  # how Python shows command-line bytes that are not UTF-8
            raise ConfigError(f"{where}: not valid UTF-8 text ({err})") from None
        raise ConfigError(f"{where}: {err}") from None


def _first_line(err: BaseException) -> str:
    text = str(err).splitlines()[0] if str(err) else type(err).__name__
    if "digits" in text:
        return "an integer has more digits than Python converts (4300)"
    return text


def parse_override(text: str) -> tuple[list[str], Any]:
    """Split `a.b.c=value` into (["a","b","c"], parsed value)."""
    key, sep, raw = text.partition("=")
    key = key.strip().lstrip("-")
    if not sep or not key:
        raise ConfigError(f"override {_short(text)} is not of the form section.key=value")
    path = key.split(".")
    if len(path) > MAX_DEPTH or not all(path):
        raise ConfigError(
            f"override {_short(key)}: a key needs non-empty parts, at most {MAX_DEPTH} of them"
        )
    _check_value(key, f"override {_short(key)}")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    except RecursionError:
        raise ConfigError(f"override {key}: value nests deeper than {MAX_DEPTH} levels") from None
    except ValueError as err:
        raise ConfigError(f"override {key}: value is not usable: {_first_line(err)}") from None
    _check_value(value, f"override {key}")
    return path, value


def _short(value: Any, limit: int = 80) -> str:
    """``repr(value)``, cut to about ``limit`` characters (a hostile value may be huge)."""
    try:
        text = repr(value)
    except ValueError:  # an int over the digit limit
        return f"<{type(value).__name__}>"
    return text if len(text) <= limit else f"{text[:limit]}...({len(text)} characters)"


def apply_override(data: dict[str, Any], path: list[str], value: Any) -> None:
    node = data
    for part in path[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {'.'.join(path)}: {part!r} is not a section")
        node = child
    node[path[-1]] = value


#: Model names that are not paths (`temper.models.loader.ALIASES`; a test keeps them equal).
MODEL_ALIASES = frozenset(
    {
        "tiny",
        "builtin:tiny",
        "tiny-rm",
        "builtin:tiny-rm",
        "tiny_vlm",
        "tiny-vlm",
        "builtin:tiny_vlm",
        "tiny-moe",
        "builtin:tiny-moe",
    }
)


def _absolute(value: Any, base: Path) -> Any:
    """``value`` against ``base`` when it is a relative path; anything else unchanged."""
    if not isinstance(value, str) or not value or Path(value).is_absolute():
        return value
    if value.startswith("~"):  # the user's home: expanded where the path is used
        return value
    return os.path.normpath(base / value)


def _absolute_file_spec(value: Any, base: Path) -> Any:
    """The file of a ``"path/file.py:function"`` spec against ``base``; modules unchanged."""
    if not isinstance(value, str):
        return value
    module_part, sep, attr = value.rpartition(":")
    is_file = module_part.endswith(".py") or "/" in module_part or "\\" in module_part
    if not sep or not is_file:
        return value
    return f"{_absolute(module_part, base)}:{attr}"


def resolve_paths(data: dict[str, Any], base: Path) -> None:
    """Make the relative paths in raw config ``data`` absolute against ``base``, in place.

    The path keys: data.path, data.eval_path, sft.path, dpo.path, dpo.eval_path, model.path
    and distill.teacher (unless a built-in name), orchestrator.train_from, and the file of a "file.py:function" reward or env.
    run.output_dir stays relative to the working directory, as runs/ is by custom.
    Values of the wrong type are left for validation to name.
    """

    def section(name: str) -> dict[str, Any]:
        value = data.get(name)
        return value if isinstance(value, dict) else {}

    for key in ("path", "eval_path"):
        if key in section("data"):
            data["data"][key] = _absolute(data["data"][key], base)
    if "path" in section("sft"):
        data["sft"]["path"] = _absolute(data["sft"]["path"], base)
    for key in ("path", "eval_path"):
        if key in section("dpo"):
            data["dpo"][key] = _absolute(data["dpo"][key], base)
    for name, key in (("model", "path"), ("distill", "teacher")):
        model_path = section(name).get(key)
        remote = isinstance(model_path, str) and model_path.startswith(("http://", "https://"))
        if model_path is not None and model_path not in MODEL_ALIASES and not remote:
            data[name][key] = _absolute(model_path, base)
    if "train_from" in section("orchestrator"):
        orch = data["orchestrator"]
        orch["train_from"] = _absolute(orch["train_from"], base)
    if "type" in section("env"):
        data["env"]["type"] = _absolute_file_spec(data["env"]["type"], base)
    components = section("reward").get("components")
    for component in components if isinstance(components, list) else []:
        if isinstance(component, dict) and "function" in component:
            component["function"] = _absolute_file_spec(component["function"], base)


def _resolved_override(keys: list[str], value: Any) -> Any:
    """An override's value with a relative path made absolute against the working directory."""
    wrapped: Any = value
    for key in reversed(keys):
        wrapped = {key: wrapped}
    resolve_paths(wrapped, Path.cwd())
    for key in keys:
        wrapped = wrapped[key]
    return wrapped


#: Sections whose config class is chosen by their ``type`` (a pydantic tagged union): the
#: tag pydantic puts in an error's location is taken out again, and named in words.
_TAGGED = {("engine",): "engine", ("reward", "components", int): "component"}


def _untagged(loc: tuple[Any, ...]) -> tuple[list[str], str | None]:
    """An error location without the union tag, and the tag's words ("the hf engine")."""
    for prefix, noun in _TAGGED.items():
        n = len(prefix)
        head = loc[:n]
        fits = len(loc) > n and all(
            isinstance(got, want) if isinstance(want, type) else got == want
            for got, want in zip(head, prefix, strict=True)
        )
        if fits:
            return [str(p) for p in (*head, *loc[n + 1 :])], f"the {loc[n]} {noun}"
    return [str(p) for p in loc], None


#: Names other trainers use for a key, suggested when they are mistyped or used as is.
_OTHER_NAMES = {
    "learning_rate": "lr",
    "max_new_tokens": "max_response_tokens",
    "num_generations": "group_size",
    "max_steps": "steps",
}


def _keys_at(loc: tuple[Any, ...]) -> list[str]:
    """The keys the section holding ``loc``'s last part accepts (a union member's own
    keys for a section chosen by ``type``); empty where the walk does not lead to one."""
    model: type[BaseModel] = Config
    parts = list(loc[:-1])
    while parts:
        field = model.model_fields.get(str(parts.pop(0)))
        models = section_models(field.annotation) if field is not None else []
        if parts and isinstance(parts[0], int):  # a list's item
            parts.pop(0)
        if len(models) > 1 and parts:  # pydantic puts the union's tag in the location
            tag = parts.pop(0)
            models = [m for m in models if _tag_of(m) == tag]
        if len(models) != 1:
            return []
        model = models[0]
    return list(model.model_fields)


def _tag_of(model: type[BaseModel]) -> Any:
    field = model.model_fields.get("type")
    return field.default if field is not None else None


def did_you_mean(loc: tuple[Any, ...]) -> str:
    """The suggestion for an unknown key at ``loc`` close to a known one (or to another
    trainer's name for one): "did you mean 'lr'?"; else ""."""
    keys, key = _keys_at(loc), str(loc[-1])
    names = {k: k for k in keys} | {o: k for o, k in _OTHER_NAMES.items() if k in keys}
    found = difflib.get_close_matches(key, list(names), n=1, cutoff=0.6)
    return f"did you mean '{names[found[0]]}'?" if found else ""


def format_validation_error(err: ValidationError) -> str:
    """One line per problem, naming the dotted field."""
    parts = []
    for e in err.errors():
        path, owner = _untagged(tuple(e["loc"]))
        loc = ".".join(path) or "config"
        if e["type"] == "extra_forbidden":
            notes = [f"{owner} has no such setting" if owner else "", did_you_mean(e["loc"])]
            note = "; ".join(n for n in notes if n)
            parts.append(f"unknown config key '{loc}'" + (f" ({note})" if note else ""))
        elif e["type"] == "union_tag_invalid":
            ctx = e.get("ctx", {})
            parts.append(f"{loc}.type: {ctx.get('tag')!r} is not one of {ctx.get('expected_tags')}")
        elif e["type"] == "union_tag_not_found":
            parts.append(f"{loc}: needs a 'type'")
        else:
            got = e.get("input")
            shown = "" if isinstance(got, dict) else f" (got {_short(got)})"
            parts.append(f"{loc}: {e['msg']}{shown}")
    return "; ".join(parts)


def config_from_dict(data: dict[str, Any]) -> Config:
    try:
        return Config.model_validate(data)
    except ValidationError as err:
        raise ConfigError(f"invalid config: {format_validation_error(err)}") from None


def load_config(
    path: str | Path | None = None,
    overrides: list[str] | None = None,
    relative_to: Path | None = None,
) -> Config:
    """Read `path` (or the embedded default when None) and apply `overrides`.

    Relative paths in the file are read against `relative_to`, by default the
    file's folder.
    """
    data: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        try:
            found = p.is_file()
        except OSError as err:  # e.g. a name longer than the file system allows
            raise ConfigError(f"config file {_short(str(p))}: {err.strerror or err}") from None
        if not found:
            raise ConfigError(f"config file not found: {p}")
        try:
            raw = p.read_bytes()
        except OSError as err:
            raise ConfigError(f"cannot read config file {p}: {err.strerror or err}") from None
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            raise ConfigError(
                f"config file {p} is not UTF-8 text (byte 0x{raw[err.start]:02x} at "
                f"offset {err.start})"
            ) from None
        data = _parse_toml(text, f"config file {p}")
        resolve_paths(data, relative_to or p.absolute().parent)
    for text in overrides or []:
        keys, value = parse_override(text)
        apply_override(data, keys, _resolved_override(keys, value))
    return config_from_dict(data)


def run_config_path(checkpoint: str | Path) -> Path | None:
    """The config.toml of the run that wrote `checkpoint` (<run>/checkpoints/step_N), if any."""
    path = Path(checkpoint)
    if path.parent.name != "checkpoints":
        return None
    config = path.parent.parent / "config.toml"
    return config if config.is_file() else None


def load_run_config(config_toml: str | Path, overrides: list[str] | None = None) -> Config:
    """A run directory's config.toml, as the run used it.

    A run writes its resolved config, whose paths are absolute since file paths
    are resolved on load; a run written before that kept paths relative to the
    directory it was started from, so relative ones are read against the
    working directory, not against the run directory.
    """
    return load_config(config_toml, overrides, relative_to=Path.cwd())


def dump_config(cfg: Config) -> str:
    """The resolved config as TOML (None values are omitted: TOML has no null)."""
    return tomli_w.dumps(cfg.model_dump(mode="json", exclude_none=True))
