"""Load tasks from JSON lines, JSON, Parquet, Hugging Face datasets or lists of dicts.

`load_tasks` maps dataset columns onto `Task` fields (prompt, answer, id,
category) and keeps every other column in `task.columns`. Bad input raises
`DataError` with one line that names the file, the row and the field.
"""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import IO, Any, Literal

from temper.errors import DataError
from temper.records import Task
from temper.rewards.answers import extract_boxed, extract_gsm8k_answer

AnswerExtractor = Literal["gsm8k", "boxed"] | Callable[[str], str | None]

_EXTENSIONS = (".jsonl", ".jsonl.gz", ".json", ".json.gz", ".parquet")
#: name -> (extractor, what is wrong with the row when it returns None)
_EXTRACTORS: dict[str, tuple[Callable[[str], str | None], str]] = {
    "gsm8k": (extract_gsm8k_answer, "has no '#### <answer>' line"),
    "boxed": (extract_boxed, "has no \\boxed{...} answer"),
}

#: Where a prompt's text shows an image of its row (`image_field`).
IMAGE_MARKER = "<image>"
#: (where in the source, e.g. "line 3" or "row 2"; the row)
_Row = tuple[str, Mapping[str, Any]]


def load_tasks(
    source: str | os.PathLike[str] | Iterable[Mapping[str, Any]] | Any,
    *,
    prompt_field: str = "prompt",
    answer_field: str | None = "answer",
    id_field: str | None = None,
    category_field: str | None = None,
    answer_extractor: AnswerExtractor | None = None,
    split: str | None = None,
    image_field: str | None = "images",
) -> list[Task]:
    """Read a dataset and return one `Task` per row.

    `source` is a path to a `.jsonl`, `.json` (JSON lines or one JSON array),
    `.jsonl.gz`/`.json.gz` or `.parquet` file; a directory holding
    `<split>.jsonl`/`.json`/`.parquet` (with `split=`); a Hugging Face
    `datasets.Dataset` (or `DatasetDict` with `split=`); or a list of dicts.

    Field mapping: `prompt_field` gives `task.prompt` (a string or a list of
    `{"role", "content"}` messages); `answer_field` gives `task.answer` (None to
    load no answers; numbers become strings); `id_field` gives `task.id` (default
    `"<source name>-<row index>"`; ids must be unique); `category_field` gives
    `task.category` (default "default"). All other columns, the category column
    and the raw answer column when it is not named "answer" go to `task.columns`.

    `answer_extractor` reduces the answer: "gsm8k" keeps what follows `####`
    ("... #### 1,200" gives "1200"), "boxed" keeps the last `\\boxed{...}`
    content, a function maps the raw string to the answer (None for no answer).

    `image_field` names a column of images (one, or a list; any form
    `temper.vision.load_image` reads: bytes, a path, a data URL, an HF
    datasets `Image`). A row that has it gets a prompt of content parts: each
    `<image>` in the prompt text is replaced by the next image, and images
    without a marker go before the text. Images are decoded when rendered.
    """
    label, rows = _read_source(source, split)
    if not rows:
        raise DataError(f"{label}: dataset is empty")
    extract = _resolve_extractor(answer_extractor)
    # The answer and category columns stay in `columns` under their own names (the answer
    # raw, before extraction): a TRL-style reward function asks for dataset columns by
    # their dataset names.
    mapped = {f for f in (prompt_field, id_field, image_field) if f is not None}
    if answer_field == "answer":
        mapped.add(answer_field)
    prefix = _id_prefix(label)
    tasks: list[Task] = []
    first_seen: dict[str, str] = {}
    for index, (where, row) in enumerate(rows):
        at = f"{label} {where}"
        task_id = str(_field(row, id_field, at)) if id_field else f"{prefix}-{index}"
        if task_id in first_seen:
            raise DataError(f"{at}: duplicate id {task_id!r} (first seen at {first_seen[task_id]})")
        first_seen[task_id] = where
        tasks.append(
            Task(
                id=task_id,
                prompt=_with_images(
                    _prompt(_field(row, prompt_field, at), prompt_field, at),
                    row.get(image_field) if image_field else None,
                    at,
                ),
                answer=_answer(row, answer_field, extract, at),
                category=str(_field(row, category_field, at)) if category_field else "default",
                columns={k: v for k, v in row.items() if k not in mapped},
            )
        )
    return tasks


# -- reading sources ------------------------------------------------------------------


def _read_source(source: Any, split: str | None) -> tuple[str, list[_Row]]:
    """Return (a label naming the source for messages, its rows)."""
    if isinstance(source, str | os.PathLike):
        return _read_path(Path(source), split)
    if type(source).__module__.split(".")[0] == "datasets":
        return _read_hf(source, split)
    if isinstance(source, Mapping):
        raise DataError("dataset source is a single dict; pass a list of row dicts")
    if isinstance(source, Iterable):
        if split is not None:
            raise DataError("split= applies only to a directory or a DatasetDict, not a list")
        rows: list[_Row] = []
        for i, row in enumerate(source):
            if not isinstance(row, Mapping):
                raise DataError(f"dataset row {i} is a {type(row).__name__}, not a dict")
            rows.append((f"row {i}", row))
        return "dataset", rows
    raise DataError(f"unsupported dataset source of type {type(source).__name__}")


def _read_path(path: Path, split: str | None) -> tuple[str, list[_Row]]:
    if path.is_dir():
        if split is None:
            raise DataError(
                f"{path} is a directory; pass split= to load <split>.jsonl/.json/.parquet"
            )
        candidates = [path / f"{split}{ext}" for ext in _EXTENSIONS]
        found = next((c for c in candidates if c.is_file()), None)
        if found is None:
            raise DataError(
                f"no file for split {split!r} in {path} (looked for {split}.jsonl/.json/.parquet)"
            )
        path = found
    elif split is not None:
        raise DataError(f"split= applies only to a directory or a DatasetDict, not the file {path}")
    if not path.is_file():
        raise DataError(f"dataset file not found: {path}")
    name = path.name.lower()
    if not name.endswith(_EXTENSIONS):
        raise DataError(f"{path}: unsupported file type; use .jsonl, .json or .parquet")
    if name.endswith(".parquet"):
        return str(path), _read_parquet(path)
    return str(path), _read_json(path)


def _open_text(path: Path) -> IO[str]:
    if path.name.lower().endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8")
    return open(path, encoding="utf-8")


def _read_json(path: Path) -> list[_Row]:
    """JSON lines, or a single JSON array of objects."""
    try:
        with _open_text(path) as f:
            text = f.read()
    except (UnicodeDecodeError, OSError) as exc:
        raise DataError(f"{path}: cannot read as UTF-8 text ({type(exc).__name__})") from None
    if text.lstrip().startswith("["):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise DataError(f"{path}: bad JSON on line {exc.lineno}: {exc.msg}") from None
        return [(f"row {i}", _as_object(obj, path, f"row {i}")) for i, obj in enumerate(data)]
    rows: list[_Row] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"{path}: bad JSON on line {number}: {exc.msg}") from None
        rows.append((f"line {number}", _as_object(obj, path, f"line {number}")))
    return rows


def _as_object(obj: Any, path: Path, where: str) -> Mapping[str, Any]:
    if not isinstance(obj, dict):
        raise DataError(f"{path} {where}: expected a JSON object, got {type(obj).__name__}")
    return obj


def _read_parquet(path: Path) -> list[_Row]:
    import pyarrow.parquet as pq

    try:
        records = pq.read_table(path).to_pylist()
    except Exception as exc:
        raise DataError(f"{path}: cannot read as parquet ({type(exc).__name__})") from None
    return [(f"row {i}", row) for i, row in enumerate(records)]


def _read_hf(source: Any, split: str | None) -> tuple[str, list[_Row]]:
    """Rows of a Hugging Face `Dataset`, `IterableDataset` or one split of a `DatasetDict`."""
    import datasets

    label = "Hugging Face dataset"
    if isinstance(source, datasets.DatasetDict | datasets.IterableDatasetDict):
        if split is None:
            raise DataError(f"{label} has splits {sorted(source)}; pass split=")
        if split not in source:
            raise DataError(f"{label} has no split {split!r} (splits: {sorted(source)})")
        source = source[split]
        label = f"{label} split {split!r}"
    elif split is not None:
        raise DataError(f"split= applies only to a DatasetDict; got a {type(source).__name__}")
    records = source.to_list() if hasattr(source, "to_list") else list(source)
    return label, [(f"row {i}", row) for i, row in enumerate(records)]


# -- mapping fields -----------------------------------------------------------------


def _id_prefix(label: str) -> str:
    if label.startswith(("dataset", "Hugging Face")):
        return "task"
    name = Path(label).name
    for ext in _EXTENSIONS:
        if name.lower().endswith(ext):
            return name[: -len(ext)]
    return name


def _field(row: Mapping[str, Any], field: str | None, at: str) -> Any:
    if field is None:
        return None
    if field not in row:
        available = ", ".join(sorted(map(str, row))) or "none"
        raise DataError(f"{at}: missing field {field!r} (available: {available})")
    return row[field]


def _prompt(value: Any, field: str, at: str) -> str | list[dict[str, Any]]:
    if isinstance(value, str):
        if not value.strip():
            raise DataError(f"{at}: field {field!r} is empty")
        return value
    if isinstance(value, list) and value:
        for i, message in enumerate(value):
            if (
                not isinstance(message, Mapping)
                or "role" not in message
                or "content" not in message
            ):
                raise DataError(
                    f"{at}: field {field!r} message {i} must be a dict with 'role' and 'content'"
                )
        return [dict(m) for m in value]
    raise DataError(
        f"{at}: field {field!r} must be a string or a non-empty list of chat messages, "
        f"got {type(value).__name__}"
    )


def _with_images(
    prompt: str | list[dict[str, Any]], images: Any, at: str
) -> str | list[dict[str, Any]]:
    """The prompt with the row's images as content parts (unchanged without images)."""
    if images is None:
        return prompt
    images = list(images) if isinstance(images, list | tuple) else [images]
    if not images:
        return prompt
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
    users = [i for i, m in enumerate(messages) if m.get("role") == "user"]
    if not users or not isinstance(messages[users[0]]["content"], str):
        raise DataError(f"{at}: images need a prompt whose first user message is text")
    first = users[0]
    pieces = messages[first]["content"].split(IMAGE_MARKER)
    if len(pieces) - 1 > len(images):
        raise DataError(
            f"{at}: the prompt has {len(pieces) - 1} {IMAGE_MARKER} markers but the row has "
            f"{len(images)} image(s)"
        )
    parts: list[dict[str, Any]] = [
        {"type": "image", "image": im} for im in images[len(pieces) - 1 :]
    ]
    for k, piece in enumerate(pieces):
        if piece:
            parts.append({"type": "text", "text": piece})
        if k < len(pieces) - 1:
            parts.append({"type": "image", "image": images[k]})
    messages = [dict(m) for m in messages]
    messages[first]["content"] = parts
    return messages


def _answer(
    row: Mapping[str, Any],
    field: str | None,
    extract: tuple[Callable[[str], str | None], str] | None,
    at: str,
) -> str | None:
    if field is None:
        return None
    value = _field(row, field, at)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise DataError(
            f"{at}: field {field!r} must be a string or a number, got {type(value).__name__}"
        )
    text = str(value)
    if extract is None:
        return text
    fn, problem = extract
    answer = fn(text)
    if answer is None:
        raise DataError(f"{at}: field {field!r} {problem}")
    return answer


def _resolve_extractor(
    extractor: AnswerExtractor | None,
) -> tuple[Callable[[str], str | None], str] | None:
    if extractor is None:
        return None
    if callable(extractor):
        name = getattr(extractor, "__name__", "answer_extractor")
        return extractor, f"gave no answer (answer_extractor {name} returned None)"
    if extractor in _EXTRACTORS:
        return _EXTRACTORS[extractor]
    raise DataError(f"unknown answer_extractor {extractor!r}; use 'gsm8k', 'boxed' or a function")
