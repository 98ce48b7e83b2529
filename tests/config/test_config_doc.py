"""docs/config.md is what the schema renders now; every key is in it and described."""

from pathlib import Path

from temper.config.doc import render_config_doc, section_models, type_name, undocumented_keys
from temper.config.schema import Config

DOC = Path(__file__).resolve().parents[2] / "docs" / "config.md"


def test_committed_config_doc_is_current():
    assert DOC.read_text() == render_config_doc(), (
        "docs/config.md is stale: run python scripts/gen_config_doc.py"
    )


def test_every_key_has_a_row_with_its_default():
    text = render_config_doc()
    for section, field in Config.model_fields.items():
        assert f"## `{section}`" in text
        for model in section_models(field.annotation):  # each engine type has its section
            for name, sub in model.model_fields.items():
                row = f"| `{name}` | `{type_name(sub.annotation).replace('|', chr(92) + '|')}` |"
                assert row in text
    # A nested section's defaults are those of its default instance, not "required".
    nan = text.split("## `health.nan`")[1].split("##")[0]
    assert "| `threshold` | `float` | `required`" not in nan


def test_every_key_has_a_description():
    assert undocumented_keys() == []


def test_each_engine_and_reward_component_type_has_its_own_section():
    text = render_config_doc()
    for tag in ("native", "hf", "vllm", "openai"):
        assert f'## `engine` (type = "{tag}")' in text
    for tag in ("math", "python", "judge", "reward_model", "overlong"):
        assert f'## `reward.components[]` (type = "{tag}")' in text
    hf = text.split('## `engine` (type = "hf")')[1].split("##")[0]
    assert "max_slots" not in hf  # each type lists only its own settings
