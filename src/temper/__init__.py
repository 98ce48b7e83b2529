"""Temper: reinforcement-learning post-training for language models.

Runs whole on one CPU machine with a built-in tiny model; the same components
scale out. See docs/architecture.md for the map of the code.
"""

__version__ = "0.1.0"

from temper.torch_extensions import hide_mismatched_extensions as _hide

_hide()  # CUDA builds of torchvision & co. beside a CPU torch cannot load (see the module)
