"""Temper: reinforcement-learning post-training for language models.

Runs whole on one CPU machine with a built-in tiny model; the same components
scale out. See docs/architecture.md for the map of the code.

`temper.train(config, reward_funcs=[fn], dataset=rows)` is the Python API
(`temper.api`); it is imported on first use, so `import temper` stays light.
"""

__version__ = "0.1.0"

from temper.torch_extensions import hide_mismatched_extensions as _hide

_hide()  # CUDA builds of torchvision & co. beside a CPU torch cannot load (see the module)

from typing import Any  # noqa: E402

#: Names served lazily from `temper.api`.
_API = ("train", "atrain", "prepare_config", "TrainResult")
__all__ = ["__version__", *_API]


def __getattr__(name: str) -> Any:
    if name in _API:
        from temper import api

        return getattr(api, name)
    raise AttributeError(f"module 'temper' has no attribute {name!r}")
