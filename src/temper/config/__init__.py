"""temper.config: the typed run config (pydantic v2), imported by everything, importing
nothing of Temper's runtime.

`schema.py` (`Config`: one small section per component; unknown keys are errors),
one module per larger section (`engine.py`: one class per ``engine.type`` in a
tagged union; `reward.py`: one class per component ``type``; `env.py` with
`EpisodeLimits`; `trainer.py`, `algo.py`, `critic.py`, `orchestrator.py`,
`sampler.py`, `self_improve.py`, `health.py`, `lora.py`, `dpo.py`, `distill.py`), `load.py` (TOML files and dotted
overrides; relative paths against the file's folder; one-line errors naming the
field), `doc.py` (renders docs/config.md; a test keeps it current).
"""

from temper.config.load import config_from_dict, dump_config, load_config
from temper.config.schema import Config

__all__ = ["Config", "config_from_dict", "dump_config", "load_config"]
