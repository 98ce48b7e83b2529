"""ExactMatchReward and JSONSchemaReward, directly and through the config."""

import asyncio
import json

import pytest

from temper.builder.rewards import build_reward
from temper.config.reward import JSONSchemaComponent, RewardConfig
from temper.errors import ConfigError
from temper.records import Task
from temper.rewards import RewardInput
from temper.rewards.format_reward import ExactMatchReward, JSONSchemaReward, extract_json_text

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0}},
    "required": ["name", "age"],
}


def run(reward, texts, answer="42", columns=None):
    batch = [
        RewardInput(Task(id=str(i), prompt="q", answer=answer, columns=columns or {}), "q", t)
        for i, t in enumerate(texts)
    ]
    return asyncio.run(reward.score(batch))


def test_exact_match_stripped_or_last_boxed():
    texts = [
        "42",
        "  42\n",
        "so \\boxed{7} no wait \\boxed{ 42 }",
        "42.0",
        "\\boxed{42} or 43",
        "x",
    ]
    results = run(ExactMatchReward(), texts)
    assert [r.score for r in results] == [1.0, 1.0, 1.0, 0.0, 1.0, 0.0]
    assert [r.correct for r in results] == [True, True, True, False, True, False]
    assert results[0].components == {"exact": 1.0}
    assert [r.score for r in run(ExactMatchReward(), ["Paris", "paris"], answer="Paris")] == [
        1.0,
        0.0,
    ]
    loose = ExactMatchReward(ignore_case=True)
    assert [r.score for r in run(loose, ["PARIS", "\\boxed{paris}"], answer="Paris")] == [1.0, 1.0]


def test_exact_match_without_answer_is_an_error():
    (result,) = run(ExactMatchReward(), ["42"], answer=None)
    assert result.error is not None and result.score == 0.0


def test_json_schema_valid_invalid_unparseable():
    reward = JSONSchemaReward(SCHEMA)
    texts = [
        '{"name": "Ada", "age": 36}',
        'Here you go:\n```json\n{"name": "x", "age": 1}\n```\nand a fixed one:\n'
        '```json\n{"name": "Ada", "age": 36}\n```',
        '{"name": "Ada", "age": -1}',
        '{"name": "Ada"}',
        '{"name": "Ada", "age": 36',
        "not json at all",
        '```json\n{"name": "Ada"}\n```',
    ]
    results = run(reward, texts)
    assert [r.score for r in results] == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    assert [r.components["parses"] for r in results] == [1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 1.0]
    assert all(r.error is None for r in results)
    assert results[0].components["json_schema"] == 1.0


def test_extract_json_text_takes_last_block():
    assert extract_json_text("a\n```json\n[1]\n```\nb\n```json\n[2]\n```") == "[2]"
    assert extract_json_text("  [3] ") == "[3]"


def test_json_schema_from_task_column():
    reward = JSONSchemaReward(schema_field="schema")
    good = run(reward, ['{"name": "Ada", "age": 3}'], columns={"schema": SCHEMA})[0]
    as_text = run(reward, ['{"name": "Ada"}'], columns={"schema": json.dumps(SCHEMA)})[0]
    assert good.score == 1.0 and as_text.score == 0.0 and as_text.error is None
    missing = run(reward, ["{}"], columns={})[0]
    assert missing.error is not None and "schema" in missing.error
    bad = run(reward, ["{}"], columns={"schema": {"type": 12}})[0]
    assert bad.error is not None


def test_json_schema_constructor_checks():
    with pytest.raises(ConfigError):
        JSONSchemaReward({"type": 12})
    with pytest.raises(ConfigError):
        JSONSchemaReward()
    with pytest.raises(ConfigError):
        JSONSchemaReward(SCHEMA, schema_field="schema")


def test_config_path_builds_exact_and_json_schema():
    cfg = RewardConfig.model_validate(
        {
            "components": [
                {"type": "exact", "weight": 2.0},
                {"type": "json_schema", "schema": {"type": "integer"}, "weight": 0.5},
            ]
        }
    )
    reward = build_reward(cfg)
    right, wrong_json, loop = run(reward, ["42", "\\boxed{42}", "7 " * 60])
    assert right.score == 2.5 and right.correct is True
    assert right.components["json_schema/parses"] == 1.0
    assert wrong_json.score == 2.0
    assert wrong_json.components["json_schema"] == 0.0
    # "7 7 7 ..." does not parse as JSON, and it is flagged as gibberish.
    assert loop.score == 0.0 and loop.components["hack/gibberish"] == 1.0

    col = RewardConfig.model_validate(
        {"components": [{"type": "json_schema", "schema_field": "s"}], "filters": []}
    )
    (result,) = run(build_reward(col), ['{"name": "A", "age": 1}'], columns={"s": SCHEMA})
    assert result.score == 1.0
    with pytest.raises(ValueError):
        JSONSchemaComponent()
    with pytest.raises(ValueError):
        JSONSchemaComponent.model_validate(
            {"type": "json_schema", "schema": {}, "schema_field": "s"}
        )


def test_json_schema_hostile_completions_score_zero():
    # Deep nesting (json.loads: RecursionError), a 5,000-digit integer (json.loads:
    # ValueError about int conversion) and NaN all score 0 as "does not parse".
    texts = ["[" * 1000, "[" * 100_000, '{"name": "a", "age": ' + "9" * 5000 + "}", "NaN"]
    results = run(JSONSchemaReward(SCHEMA), texts)
    assert [r.score for r in results] == [0.0] * 4
    assert [r.components["parses"] for r in results] == [0.0] * 4
    deep_schema = run(
        JSONSchemaReward(schema_field="schema"), ["{}"], columns={"schema": "[" * 5000}
    )
    assert deep_schema[0].score == 0.0 and "bad schema" in deep_schema[0].error
