"""Format rewards: 1.0 when the completion has the required shape, else 0.0.

`FormatReward` (regex), `BoxedFormatReward`, `ExactMatchReward` (equals the
answer) and `JSONSchemaReward` (JSON valid against a schema).
"""

from __future__ import annotations

import re
from typing import Any

from temper import safe_json
from temper.errors import ConfigError
from temper.rewards.answers import extract_boxed, find_last_boxed
from temper.rewards.base import RewardDefaults, RewardInput, RewardResult

#: A completion that ends with `\boxed{...}` (braces nested up to three deep),
#: optionally followed by whitespace.
BOXED_AT_END = r"\\boxed\{(?:[^{}]|\{(?:[^{}]|\{(?:[^{}]|\{[^{}]*\})*\})*\})*\}\s*\Z"


class FormatReward(RewardDefaults):
    """`match_score` when the regex `pattern` matches the completion, else `miss_score`.

    With `full_match=False` (default) the pattern may match anywhere
    (`re.search`); with `full_match=True` it must match the whole completion
    (`re.fullmatch`). `flags` defaults to `re.DOTALL`, so `.` also matches
    newlines. The default pattern accepts completions that end with
    `\\boxed{...}` plus optional whitespace.
    """

    def __init__(
        self,
        pattern: str = BOXED_AT_END,
        *,
        full_match: bool = False,
        flags: int = re.DOTALL,
        name: str = "format",
        match_score: float = 1.0,
        miss_score: float = 0.0,
    ) -> None:
        self.name = name
        self.regex = re.compile(pattern, flags)
        self.full_match = full_match
        self.match_score = match_score
        self.miss_score = miss_score

    def matches(self, text: str) -> bool:
        """Whether `text` has the required format."""
        if self.full_match:
            return self.regex.fullmatch(text) is not None
        return self.regex.search(text) is not None

    async def score(self, inputs: list[RewardInput]) -> list[RewardResult]:
        """Score each completion by whether it matches."""
        out = []
        for item in inputs:
            value = self.match_score if self.matches(item.completion_text) else self.miss_score
            out.append(RewardResult(score=value, components={self.name: value}))
        return out


class BoxedFormatReward(FormatReward):
    """1.0 when the completion ends with a `\\boxed{...}` (any brace depth), else 0.0.

    Like `FormatReward()` with its default pattern, but braces are matched by
    counting, so any nesting depth is accepted. Only whitespace may follow.
    """

    def __init__(
        self, *, name: str = "boxed_format", match_score: float = 1.0, miss_score: float = 0.0
    ) -> None:
        super().__init__(name=name, match_score=match_score, miss_score=miss_score)

    def matches(self, text: str) -> bool:
        found = find_last_boxed(text)
        if found is None:
            return False
        _, start, end = found
        return text.startswith("\\boxed", start) and not text[end:].strip()


class ExactMatchReward(RewardDefaults):
    """1.0 when the completion equals the task's answer, else 0.0.

    The completion matches when its stripped text, or the content of its last
    `\\boxed{...}`, equals the stripped `task.answer` (with `ignore_case`,
    compared case-insensitively). `correct` is set to the verdict. A task
    without an answer gives a result with `error` set (score 0.0).
    """

    def __init__(self, *, name: str = "exact", ignore_case: bool = False) -> None:
        self.name = name
        self.ignore_case = ignore_case

    def _norm(self, text: str) -> str:
        text = text.strip()
        return text.casefold() if self.ignore_case else text

    def matches(self, completion: str, answer: str) -> bool:
        """Whether `completion` (stripped, or its last boxed content) equals `answer`."""
        gold = self._norm(answer)
        if self._norm(completion) == gold:
            return True
        boxed = extract_boxed(completion)
        return boxed is not None and self._norm(boxed) == gold

    async def score(self, inputs: list[RewardInput]) -> list[RewardResult]:
        out = []
        for item in inputs:
            if item.task.answer is None:
                out.append(RewardResult(score=0.0, error=f"task {item.task.id!r} has no answer"))
                continue
            ok = self.matches(item.completion_text, str(item.task.answer))
            value = 1.0 if ok else 0.0
            out.append(RewardResult(score=value, components={self.name: value}, correct=ok))
        return out


_JSON_BLOCK = re.compile(r"```json[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)


def extract_json_text(text: str) -> str:
    """The content of the last ```json fenced block in `text`, else the stripped text."""
    blocks = _JSON_BLOCK.findall(text)
    return blocks[-1].strip() if blocks else text.strip()


class JSONSchemaReward(RewardDefaults):
    """1.0 when the completion is JSON valid against a JSON schema, else 0.0.

    The JSON is the content of the completion's last ```json block, or else the
    whole stripped completion. The schema is `schema` (a dict, checked when
    constructed) or, with `schema_field`, the task's column of that name (a
    dict or a JSON string). Components: `"parses"` (1.0 when the JSON parses)
    beside the score. A task missing the schema column, or whose schema is not
    a valid JSON schema, gives a result with `error` set. Needs `jsonschema`.
    """

    def __init__(
        self,
        schema: dict[str, Any] | None = None,
        *,
        schema_field: str | None = None,
        name: str = "json_schema",
    ) -> None:
        import jsonschema

        if (schema is None) == (schema_field is None):
            raise ConfigError("JSONSchemaReward needs exactly one of schema or schema_field")
        self._jsonschema = jsonschema
        if schema is not None:
            try:
                self._validator_cls(schema).check_schema(schema)
            except jsonschema.SchemaError as exc:
                raise ConfigError(f"JSONSchemaReward: invalid JSON schema: {exc.message}") from exc
        self.schema = schema
        self.schema_field = schema_field
        self.name = name

    def _validator_cls(self, schema: dict[str, Any]) -> Any:
        return self._jsonschema.validators.validator_for(schema)

    def _task_schema(self, item: RewardInput) -> dict[str, Any]:
        if self.schema is not None:
            return self.schema
        assert self.schema_field is not None
        if self.schema_field not in item.task.columns:
            raise ValueError(f"task {item.task.id!r} has no column {self.schema_field!r}")
        schema = item.task.columns[self.schema_field]
        if isinstance(schema, str):
            schema = safe_json.loads(schema)
        if not isinstance(schema, dict):
            raise ValueError(f"column {self.schema_field!r} is not a JSON schema object")
        self._validator_cls(schema).check_schema(schema)
        return schema

    def _score_one(self, item: RewardInput) -> RewardResult:
        try:
            schema = self._task_schema(item)
        except (ValueError, self._jsonschema.SchemaError) as exc:
            return RewardResult(score=0.0, error=f"bad schema: {exc}")
        try:
            # safe_json: model output is untrusted (deep nesting, huge numbers, NaN).
            value = safe_json.loads(extract_json_text(item.completion_text))
        except safe_json.JSONInputError:
            return RewardResult(score=0.0, components={self.name: 0.0, "parses": 0.0})
        valid = self._validator_cls(schema)(schema).is_valid(value)
        score = 1.0 if valid else 0.0
        return RewardResult(score=score, components={self.name: score, "parses": 1.0})

    async def score(self, inputs: list[RewardInput]) -> list[RewardResult]:
        return [self._score_one(item) for item in inputs]
