"""LoRA adapter updates in vLLM: each version is one of vLLM's LoRA adapters.

vLLM applies a LoRA adapter per request (its punica kernels), so an adapter update
(`temper.weights.adapter`) touches neither the base weights nor the requests in
flight: a request keeps the adapter it was submitted with until it finishes, and
every request after the update takes the new one. So each token records the version
that really sampled it, without the abort-and-resume a full update needs.

`AdapterVersions` writes each update as a peft adapter directory (B already carries
the scale, so ``lora_alpha = r``), names it ``lora_int_id = version + 1`` (version 0
is the base model: no adapter), counts the requests using each version, and hands
back the versions that nothing uses any more and are not the newest, for vLLM to
drop. With ``orchestrator.max_staleness = k`` requests in flight are at most ``k``
versions old, so ``k + 1`` adapters are loaded at once (vLLM's ``max_loras``).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from temper.weights.adapter import LORA_A, LORA_B, adapter_pairs

#: The ranks vLLM 0.32 accepts as ``max_lora_rank``.
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def vllm_max_rank(rank: int) -> int:
    """The smallest ``max_lora_rank`` vLLM accepts that holds ``rank``."""
    for allowed in VLLM_LORA_RANKS:
        if allowed >= rank:
            return allowed
    raise ValueError(f"lora.rank {rank} is above vLLM's largest max_lora_rank (512)")


def write_peft_adapter(
    state_dict: Mapping[str, torch.Tensor], folder: Path, base_model: str
) -> None:
    """``state_dict`` (``<module>.lora_A``, scaled ``<module>.lora_B``) as a peft LoRA
    directory vLLM loads: ``adapter_model.safetensors`` and ``adapter_config.json``."""
    pairs = adapter_pairs(state_dict)  # checks that every layer has both halves
    tensors: dict[str, torch.Tensor] = {}
    ranks = set()
    for weight in pairs:
        module = weight.removesuffix(".weight")
        a, b = state_dict[module + LORA_A], state_dict[module + LORA_B]
        ranks.add(int(a.shape[0]))
        prefix = f"base_model.model.{module}"
        tensors[f"{prefix}.lora_A.weight"] = a.detach().to("cpu", torch.float32).contiguous()
        tensors[f"{prefix}.lora_B.weight"] = b.detach().to("cpu", torch.float32).contiguous()
    if len(ranks) != 1:
        raise ValueError(f"adapter update: the layers have different ranks {sorted(ranks)}")
    (rank,) = ranks
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "r": rank,
        "lora_alpha": rank,  # B already holds alpha / r
        "lora_dropout": 0.0,
        "bias": "none",
        "target_modules": sorted({w.removesuffix(".weight").rsplit(".", 1)[-1] for w in pairs}),
    }
    (folder / "adapter_config.json").write_text(json.dumps(config, indent=1))


class AdapterVersions:
    """The adapter versions a vLLM engine holds, and which requests use them."""

    def __init__(self, base_model: str) -> None:
        self.base_model = base_model
        self.folder = Path(tempfile.mkdtemp(prefix="temper_vllm_lora_"))
        self.current: Any = None  # the newest version's LoRARequest (None: the base model)
        self._requests: dict[int, Any] = {}  # version -> LoRARequest
        self._users: Counter[int] = Counter()

    def add(self, state_dict: Mapping[str, torch.Tensor], version: int) -> Any:
        """Write ``version`` and make it the one new requests take; its LoRARequest."""
        from vllm.lora.request import LoRARequest

        folder = self.folder / f"v{version}"
        write_peft_adapter(state_dict, folder, self.base_model)
        request = LoRARequest(f"temper-v{version}", version + 1, str(folder))
        self._requests[version] = request
        self.current = request
        return request

    def use(self) -> tuple[int | None, Any]:
        """A request starts on the newest version: (that version, its LoRARequest)."""
        if self.current is None:
            return None, None
        version = self.current.lora_int_id - 1
        self._users[version] += 1
        return version, self.current

    def release(self, version: int | None) -> None:
        """A request on ``version`` finished (or failed, or was cancelled)."""
        if version is not None:
            self._users[version] -= 1

    def retired(self) -> list[int]:
        """Versions that no request uses and that are not the newest: forgotten here,
        their vLLM ids returned (for ``remove_lora``) and their folders removed."""
        newest = None if self.current is None else self.current.lora_int_id - 1
        out = [v for v in self._requests if v != newest and self._users[v] <= 0]
        for v in out:
            del self._requests[v]
            self._users.pop(v, None)
            shutil.rmtree(self.folder / f"v{v}", ignore_errors=True)
        return [v + 1 for v in out]

    @property
    def loaded(self) -> list[int]:
        """The versions loaded now, oldest first."""
        return sorted(self._requests)

    def close(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)
