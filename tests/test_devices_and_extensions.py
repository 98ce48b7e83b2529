"""Devices from the config, and torch extensions built for another torch kept out of the way."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from temper.devices import resolve_device, trainer_precision
from temper.errors import ConfigError
from temper.torch_extensions import _torch_build_tag


def test_auto_picks_cuda_only_when_present_and_cuda_without_one_is_a_config_error():
    assert resolve_device("auto") == torch.device("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_device("cpu") == torch.device("cpu")
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match=r"^engine\.device = 'cuda' but torch sees no CUDA"):
            resolve_device("cuda", "engine.device")
    with pytest.raises(ConfigError, match="must be 'auto', 'cpu' or 'cuda'"):
        resolve_device("tpu")
    assert trainer_precision("auto", torch.device("cpu")) == "fp32"
    assert trainer_precision("auto", torch.device("cuda")) == "bf16"
    assert trainer_precision("fp32", torch.device("cuda")) == "fp32"


@pytest.mark.skipif(_torch_build_tag() != "cpu", reason="needs the CPU build of torch")
def test_a_cuda_build_of_torchvision_beside_a_cpu_torch_is_hidden_here_and_in_children(tmp_path):
    """A real package on disk whose version.py says +cu130 (as PyPI's torchvision does)
    and whose import fails the way the real one does."""
    pkg = tmp_path / "site" / "torchvision"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(
        "raise RuntimeError('operator torchvision::nms does not exist')\n"
    )
    (pkg / "version.py").write_text("__version__ = '0.28.0+cu130'\n")
    script = textwrap.dedent(
        """
        import importlib.util, subprocess, sys
        import temper
        print(importlib.util.find_spec("torchvision") is None)
        try:
            import torchvision
        except ImportError:
            print("ImportError")
        child = "import importlib.util; print(importlib.util.find_spec('torchvision') is None)"
        print(subprocess.run([sys.executable, "-c", child], capture_output=True, text=True).stdout.strip())
        """
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), *sys.path])}
    env.pop("TEMPER_HIDDEN_MODULES", None)
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["True", "ImportError", "True"]


def test_a_cpu_build_of_an_extension_is_left_alone(tmp_path):
    pkg = tmp_path / "site" / "torchaudio"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("VALUE = 42\n")
    (pkg / "version.py").write_text("__version__ = '2.13.0+cpu'\n")
    script = "import temper, torchaudio; print(torchaudio.VALUE)"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), *sys.path])}
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "42"


@pytest.mark.skipif(_torch_build_tag() != "cpu", reason="needs the CPU build of torch")
def test_with_torchvision_hidden_torchvision_image_processors_load_as_their_pil_twins(tmp_path):
    """vLLM's LLaVA imports transformers' torchvision Pixtral processor module by name;
    with torchvision hidden that import must still work, here and in a child."""
    pkg = tmp_path / "site" / "torchvision"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise RuntimeError('operator torchvision::nms missing')\n")
    (pkg / "version.py").write_text("__version__ = '0.28.0+cu130'\n")
    load = (
        "from transformers.models.pixtral.image_processing_pixtral import "
        "PixtralImageProcessor, _num_image_tokens; "
        "print(PixtralImageProcessor.__name__, sum(_num_image_tokens((64, 64), (16, 16))))"
    )
    script = textwrap.dedent(
        f"""
        import subprocess, sys
        import temper
        {load}
        child = {load!r}
        print(subprocess.run([sys.executable, "-c", child], capture_output=True, text=True).stdout.strip())
        """
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), *sys.path])}
    env.pop("TEMPER_HIDDEN_MODULES", None)
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == [
        "PixtralImageProcessorPil",
        "8",
        "PixtralImageProcessorPil",
        "8",
    ]
