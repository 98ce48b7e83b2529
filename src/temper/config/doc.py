"""docs/config.md, written from the pydantic schema so it cannot drift from it.

`python scripts/gen_config_doc.py` rewrites the file; tests/config/test_config_doc.py
fails when the committed file differs from what this module renders now.
"""

from __future__ import annotations

import json
import types
import typing
from typing import Any, Literal, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from temper.config.schema import Config

HEADER = """\
# Config reference

Generated from the schema (`temper/config/schema.py`) by
`python scripts/gen_config_doc.py`; do not edit by hand (a test compares).

A run is configured by a TOML file and/or dotted overrides on the command
line (`temper train cfg.toml --trainer.lr=3e-4`). Every key below is optional;
unknown keys are errors. `temper config show [CONFIG] [overrides]` prints the
resolved config. Relative paths in a config file (`data.path`,
`data.eval_path`, `model.path`, `orchestrator.train_from`, the file of a
`"file.py:function"` reward or env) are read relative to that file's folder;
relative paths given as overrides, relative to the current directory.
`run.output_dir` is always relative to the current directory.
"""


def type_name(annotation: Any) -> str:
    """A short, readable type: `int`, `"a" | "b"`, `list[int]`, `float | None`."""
    origin = get_origin(annotation)
    if origin is Literal:
        return " | ".join(json.dumps(a) for a in get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_name(a) for a in get_args(annotation))
    if origin is not None:
        name = getattr(origin, "__name__", str(origin))
        return f"{name}[{', '.join(type_name(a) for a in get_args(annotation))}]"
    if annotation is type(None):
        return "None"
    if annotation is Any:
        return "Any"
    return getattr(annotation, "__name__", str(annotation))


def default_text(field: FieldInfo, parent: BaseModel | None = None, name: str = "") -> str:
    """The default; inside a section whose default is an instance, that instance's value."""
    if parent is not None:
        value = getattr(parent, name)
    elif field.is_required():
        return "required"
    else:
        value = field.get_default(call_default_factory=True)
    if isinstance(value, BaseModel):
        return "see below"
    if value is None:
        return "unset"
    if isinstance(value, list) and value and isinstance(value[0], BaseModel):
        value = [v.model_dump(mode="json", exclude_defaults=True) for v in value]
    return json.dumps(value)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _model_of(annotation: Any) -> type[BaseModel] | None:
    """The section model of a field (or of its list items), if it is one."""
    for candidate in (annotation, *get_args(annotation)):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def _section(
    title: str, model: type[BaseModel], out: list[str], instance: BaseModel | None = None
) -> None:
    """One table per section; nested sections follow with `instance`, their default."""
    out += ["", f"## `{title}`", ""]
    doc = (model.__doc__ or "").strip()
    if doc and not doc.startswith("!!!"):  # pydantic's own BaseModel docstring
        out += [" ".join(doc.split()), ""]
    out += ["| key | type | default | description |", "|---|---|---|---|"]
    nested: list[tuple[str, type[BaseModel], BaseModel | None]] = []
    for name, field in model.model_fields.items():
        sub = _model_of(field.annotation)
        out.append(
            f"| `{name}` | `{_cell(type_name(field.annotation))}` | "
            f"`{_cell(default_text(field, instance, name))}` | {_cell(field.description or '')} |"
        )
        if sub is None:
            continue
        if get_origin(field.annotation) is list:
            nested.append((f"{title}.{name}[]", sub, None))
        else:
            value = (
                getattr(instance, name)
                if instance is not None
                else field.get_default(call_default_factory=True)
            )
            nested.append((f"{title}.{name}", sub, value if isinstance(value, sub) else None))
    for sub_title, sub, value in nested:
        _section(sub_title, sub, out, value)


def render_config_doc() -> str:
    """The whole of docs/config.md."""
    out = [HEADER.rstrip("\n")]
    for name, field in Config.model_fields.items():
        model = _model_of(field.annotation)
        assert model is not None, name
        _section(name, model, out)
    return "\n".join(out) + "\n"


def undocumented_keys() -> list[str]:
    """Dotted keys whose schema field has no description."""
    missing: list[str] = []

    def walk(prefix: str, model: type[BaseModel]) -> None:
        for name, field in model.model_fields.items():
            sub = _model_of(field.annotation)
            if not field.description:
                missing.append(f"{prefix}{name}")
            if sub is not None:
                walk(f"{prefix}{name}.", sub)

    for name, field in Config.model_fields.items():
        model = _model_of(field.annotation)
        assert model is not None, name
        walk(f"{name}.", model)
    return missing
