"""An unknown config key names the closest known one (difflib), in the same one line."""

from __future__ import annotations

import pytest

from temper.config import load_config
from temper.errors import ConfigError


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            "trainer.lerning_rate=1e-4",
            "unknown config key 'trainer.lerning_rate' (did you mean 'lr'?)",
        ),
        (
            "trainer.learning_rate=1e-4",
            "unknown config key 'trainer.learning_rate' (did you mean 'lr'?)",
        ),
        ("trainr.lr=1e-4", "unknown config key 'trainr' (did you mean 'trainer'?)"),
        ("data.eval_sise=8", "unknown config key 'data.eval_sise' (did you mean 'eval_size'?)"),
        (
            "orchestrator.max_new_tokens=64",
            "unknown config key 'orchestrator.max_new_tokens' (did you mean 'max_response_tokens'?)",
        ),
        (
            "health.throughput.treshold=0.2",
            "unknown config key 'health.throughput.treshold' (did you mean 'threshold'?)",
        ),
        (
            "engine.max_slot=4",
            "unknown config key 'engine.max_slot' (the native engine has no such setting; "
            "did you mean 'max_slots'?)",
        ),
        (
            'reward.components=[{type="format", wieght=1.0}]',
            "unknown config key 'reward.components.0.wieght' (the format component has no "
            "such setting; did you mean 'weight'?)",
        ),
        ("trainer.zzz=1", "unknown config key 'trainer.zzz'"),
    ],
)
def test_unknown_key_suggests_the_closest_known_one(override, message):
    with pytest.raises(ConfigError) as err:
        load_config(None, [override])
    assert str(err.value) == f"invalid config: {message}"


def test_a_typo_in_a_file_gets_the_suggestion_too(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[run]\nname = "x"\n\n[orchestrator]\nprompts_per_stp = 4\n')
    with pytest.raises(ConfigError, match=r"'orchestrator.prompts_per_stp' \(did you mean "
                       r"'prompts_per_step'\?\)$"):  # fmt: skip
        load_config(path)
