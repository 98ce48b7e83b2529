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
`data.eval_path`, `model.path`, `distill.teacher`, `orchestrator.train_from`, the file of a
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
    if origin is typing.Annotated:
        return type_name(get_args(annotation)[0])
    if origin is not None:
        name = origin.__name__ if isinstance(origin, type) else str(origin)
        return f"{name}[{', '.join(type_name(a) for a in get_args(annotation))}]"
    if annotation is type(None):
        return "None"
    if annotation is Any:
        return "Any"
    return annotation.__name__ if isinstance(annotation, type) else str(annotation)


def _short_dump(model: BaseModel) -> dict[str, Any]:
    """A section's non-default values, and its ``type`` always (it says which class)."""
    dumped = model.model_dump(mode="json", exclude_defaults=True)
    tag = dict(model).get("type")
    return {"type": tag, **dumped} if tag is not None else dumped


def default_text(field: FieldInfo, parent: BaseModel | None = None, name: str = "") -> str:
    """The default; inside a section whose default is an instance, that instance's value."""
    if parent is not None:
        value = dict(parent)[name]
    elif field.is_required():
        return "required"
    else:
        value = field.get_default(call_default_factory=True)
    if isinstance(value, BaseModel):
        return "see below"
    if value is None:
        return "unset"
    if isinstance(value, list) and value and isinstance(value[0], BaseModel):
        value = [_short_dump(v) for v in value]
    return json.dumps(value)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def section_models(annotation: Any) -> list[type[BaseModel]]:
    """The section models of a field: its model, its list items' model, or each class
    of a union chosen by ``type`` (`temper.config.engine`, `temper.config.reward`)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is typing.Annotated:
        return section_models(args[0])
    if origin in (list, typing.Union, types.UnionType):
        return [m for a in args for m in section_models(a)]
    return []


def _tag(model: type[BaseModel]) -> str | None:
    """The ``type`` that selects ``model`` in its union, if it is a union's member."""
    field = model.model_fields.get("type")
    args = get_args(field.annotation) if field is not None else ()
    return str(args[0]) if len(args) == 1 else None


def _section(
    title: str, model: type[BaseModel], out: list[str], instance: BaseModel | None = None
) -> None:
    """One table per section; nested sections follow with `instance`, their default."""
    out += ["", f"## {title}", ""]
    doc = (model.__doc__ or "").strip()
    if doc and not doc.startswith("!!!"):  # pydantic's own BaseModel docstring
        out += [" ".join(doc.split()), ""]
    out += ["| key | type | default | description |", "|---|---|---|---|"]
    nested: list[tuple[str, type[BaseModel], BaseModel | None]] = []
    key = title.split("`")[1]
    # A union member's ``type`` first: it says which class the rest belongs to.
    fields = sorted(model.model_fields.items(), key=lambda item: item[0] != "type")
    for name, field in fields:
        subs = section_models(field.annotation)
        out.append(
            f"| `{name}` | `{_cell(type_name(field.annotation))}` | "
            f"`{_cell(default_text(field, instance, name))}` | {_cell(field.description or '')} |"
        )
        if get_origin(field.annotation) is list:
            nested += [(_titled(f"{key}.{name}[]", sub), sub, None) for sub in subs]
        elif subs:
            value = (
                dict(instance)[name]
                if instance is not None
                else field.get_default(call_default_factory=True)
            )
            for sub in subs:
                fits = value if isinstance(value, sub) else None
                nested.append((_titled(f"{key}.{name}", sub), sub, fits))
    for sub_title, sub, value in nested:
        _section(sub_title, sub, out, value)


def _titled(title: str, model: type[BaseModel]) -> str:
    """The heading of a section: its dotted key, and the ``type`` that selects it."""
    tag = _tag(model)
    return f"`{title}` (type = {json.dumps(tag)})" if tag is not None else f"`{title}`"


def render_config_doc() -> str:
    """The whole of docs/config.md."""
    out = [HEADER.rstrip("\n")]
    for name, field in Config.model_fields.items():
        models = section_models(field.annotation)
        assert models, name
        default = field.get_default(call_default_factory=True)
        for model in models:
            title = _titled(name, model) if len(models) > 1 else f"`{name}`"
            _section(title, model, out, default if isinstance(default, model) else None)
    return "\n".join(out) + "\n"


def undocumented_keys() -> list[str]:
    """Dotted keys whose schema field has no description."""
    missing: list[str] = []

    def walk(prefix: str, model: type[BaseModel]) -> None:
        for name, field in model.model_fields.items():
            if not field.description:
                missing.append(f"{prefix}{name}")
            for sub in section_models(field.annotation):
                walk(f"{prefix}{name}.", sub)

    for name, field in Config.model_fields.items():
        models = section_models(field.annotation)
        assert models, name
        for model in models:
            walk(f"{name}.", model)
    return sorted(set(missing))
