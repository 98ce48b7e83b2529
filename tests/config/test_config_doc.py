"""docs/config.md is what the schema renders now; every key is in it and described."""

from pathlib import Path

from temper.config.doc import render_config_doc, type_name, undocumented_keys
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
        for name, sub in field.annotation.model_fields.items():
            assert (
                f"| `{name}` | `{type_name(sub.annotation).replace('|', chr(92) + '|')}` |" in text
            )
    # A nested section's defaults are those of its default instance, not "required".
    nan = text.split("## `health.nan`")[1].split("##")[0]
    assert "| `threshold` | `float` | `required`" not in nan


def test_every_key_outside_the_health_section_has_a_description():
    # health.* belongs to temper.monitor.health, whose fields name checks described there.
    assert [k for k in undocumented_keys() if not k.startswith("health.")] == []
