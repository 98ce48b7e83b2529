# ruff: noqa (model-written style, kept as is)
# entry: flatten
# case: ([[1, 2], [3], []],) -> [1, 2, 3]
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterable


def flatten(rows: Iterable[list[int]]) -> list[int]:
    return [x for row in rows for x in row]
