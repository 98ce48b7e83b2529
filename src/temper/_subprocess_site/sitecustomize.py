"""Run at start-up by Python processes that a Temper process spawns (vLLM's helpers).

`temper.torch_extensions` puts this folder on PYTHONPATH when it hides torch
extensions that cannot load beside the installed torch; this file hides the
same ones in the child, whose imports would otherwise fail the same way.
"""

import os
import sys

for _name in os.environ.get("TEMPER_HIDDEN_MODULES", "").split(","):
    if _name:
        sys.modules.setdefault(_name, None)  # `import` raises ImportError; find_spec says absent

if "torchvision" in os.environ.get("TEMPER_HIDDEN_MODULES", "").split(","):
    # transformers' torchvision image processors answer from their PIL twins (see there).
    from temper.torch_extensions import install_pil_image_processors

    install_pil_image_processors()
