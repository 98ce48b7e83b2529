"""Typed run config: schema, TOML presets, dotted overrides."""

from temper.config.load import config_from_dict, dump_config, load_config
from temper.config.schema import Config

__all__ = ["Config", "config_from_dict", "dump_config", "load_config"]
