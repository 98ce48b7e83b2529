"""The `[reward]` config section: weighted components, one config class per ``type``, and
the reward-hacking filters around their sum.

Each component takes only its own settings: a `format` component has no
``function``, a `judge` component must name its ``base_url`` and ``model``. The
builder (`temper.builder.rewards`) has one function per ``type``.

Correctness (what accuracy counts) is declared by the components: a component's
``correct_above`` threshold on its own score, or the component's own verdict
(math, exact, format, tool_call_ast; a python function returning
``{"score": x, "correct": bool}``). When several declare one, a sample is correct
when all say so; when none does, it is correct when its total reward is >= 1,
and the eval output says that this default rule was used.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Component(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    weight: float = Field(1.0, description="Weight of this component in the total reward.")
    correct_above: float | None = Field(
        None,
        allow_inf_nan=False,
        description="Declares what counts as correct (what accuracy counts): this "
        "component's own unweighted score strictly above this number. Unset: the "
        "component's own verdict, if it has one; when no component has one, a total "
        "reward >= 1.",
    )


class MathComponent(_Component):
    type: Literal["math"] = Field(
        "math", description="math-verify of the completion against the answer."
    )


class FormatComponent(_Component):
    type: Literal["format"] = Field("format", description="The completion matches a regex.")
    pattern: str | None = Field(None, description="The regex (default: a \\boxed{} answer).")


class ExactComponent(_Component):
    type: Literal["exact"] = Field(
        "exact", description="The completion (or its last \\boxed{}) equals the answer."
    )


class PythonComponent(_Component):
    type: Literal["python"] = Field("python", description="Your function, with TRL's signature.")
    function: str = Field(
        description='"module:function" or "path/file.py:function" with TRL\'s signature '
        "(prompts, completions, **columns) -> list[float], or a list of "
        '{"score": float, "correct": bool} to declare correctness.'
    )


class OverlongComponent(_Component):
    type: Literal["overlong"] = Field(
        "overlong",
        description="DAPO's soft overlong penalty in [-1, 0]; lengths in tokens of the run's "
        "tokenizer.",
    )
    max_tokens: int = Field(ge=1, description="L_max; longer completions get -1.")
    cache_tokens: int = Field(
        ge=1,
        description="L_cache; the penalty ramps linearly from 0 at max_tokens - cache_tokens "
        "to -1 at max_tokens.",
    )

    @model_validator(mode="after")
    def _cache_fits(self) -> OverlongComponent:
        if self.cache_tokens > self.max_tokens:
            raise ValueError("overlong: cache_tokens must be <= max_tokens")
        return self


class JSONSchemaComponent(_Component):
    # `schema` is an alias (pydantic reserves the name); the dump's `json_schema` also loads.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, populate_by_name=True)

    type: Literal["json_schema"] = Field(
        "json_schema",
        description="The completion (or its last ```json block) is JSON valid against a schema.",
    )
    json_schema: dict[str, Any] | None = Field(
        None, alias="schema", description="The JSON schema (key `schema`)."
    )
    schema_field: str | None = Field(None, description="The task column holding each schema.")

    @model_validator(mode="after")
    def _one_schema(self) -> JSONSchemaComponent:
        if (self.json_schema is None) == (self.schema_field is None):
            raise ValueError(
                "reward component of type 'json_schema' needs exactly one of schema or schema_field"
            )
        return self


class ToolCallASTComponent(_Component):
    type: Literal["tool_call_ast"] = Field(
        "tool_call_ast",
        description="The completion's tool calls match the task's expected calls (BFCL AST "
        "rules, temper.rewards.tool_call_ast).",
    )
    ground_truth_field: str = Field(
        "ground_truth",
        description="The task column holding the expected calls, BFCL format "
        "[{function: {arg: [allowed values]}}].",
    )
    functions_field: str = Field(
        "functions",
        description="The task column holding the function schemas (BFCL or OpenAI format); "
        "optional per task, used for types and required args.",
    )


class RewardModelComponent(_Component):
    type: Literal["reward_model"] = Field(
        "reward_model",
        description="A sequence-classification reward model, in process (model) or behind "
        "temper serve-rm (base_url).",
    )
    model: str | None = Field(
        None, description='A reward model directory or "tiny-rm", run in process.'
    )
    base_url: str | None = Field(None, description="A temper serve-rm URL.")

    @model_validator(mode="after")
    def _one_place(self) -> RewardModelComponent:
        if (self.model is None) == (self.base_url is None):
            raise ValueError(
                "reward component of type 'reward_model' needs exactly one of 'model' (in "
                "process) or 'base_url' (a temper serve-rm URL)"
            )
        return self


class JudgeComponent(_Component):
    type: Literal["judge"] = Field(
        "judge", description="An LLM judge behind any OpenAI-compatible endpoint."
    )
    base_url: str = Field(description='The endpoint, e.g. "http://127.0.0.1:8000/v1".')
    model: str = Field(description="The model id sent to the endpoint.")
    api_key_env: str | None = Field(None, description="Environment variable holding the API key.")


RewardComponentConfig = Annotated[
    MathComponent
    | FormatComponent
    | ExactComponent
    | PythonComponent
    | OverlongComponent
    | JSONSchemaComponent
    | ToolCallASTComponent
    | RewardModelComponent
    | JudgeComponent,
    Field(discriminator="type"),
]


class RewardConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    components: list[RewardComponentConfig] = Field(
        default_factory=lambda: [MathComponent()],
        description="Weighted components summed into the reward.",
    )
    on_error: Literal["zero", "drop"] = Field(
        "zero", description="A sample whose reward fails scores 0, or is dropped."
    )
    timeout_s: float = Field(5.0, gt=0, description="Per-item verification timeout.")
    workers: int = Field(1, ge=1, description="Reward worker processes.")
    check_samples: int = Field(
        4,
        ge=0,
        description="Before the step-0 eval, generate one completion for each of this many "
        "training tasks and score it; if the reward fails on every one, the run stops (exit "
        "2) with the error, its traceback in events.jsonl. 0 turns the check off.",
    )
    filters: list[Literal["repetition", "gibberish"]] = Field(
        default_factory=lambda: ["repetition", "gibberish"],
        description="Reward-hacking filters: a flagged completion's total reward is zeroed "
        "(negative totals kept) and logged as component hack/<kind>. [] turns them off.",
    )
    repetition_ngram: int = Field(4, ge=1, description="repetition: n of the word n-grams.")
    repetition_threshold: float = Field(
        0.5,
        gt=0,
        lt=1,
        description="repetition: flag when the share of repeated n-grams (1 - distinct/total) "
        "exceeds this (texts under 20 n-grams are never flagged).",
    )
    gibberish_threshold: float = Field(
        0.1,
        gt=0,
        lt=1,
        description="gibberish: flag when the share of non-printable/U+FFFD characters exceeds "
        "this (also flags 40+ visible characters with <= 3 distinct or one > half of them, "
        "or one word > half of 10+ words).",
    )
