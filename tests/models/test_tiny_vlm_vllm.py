"""The tiny VLM through vLLM's CPU build, with an image (runs in .venv-vllm).

vLLM loads the shipped directory as it is (LLaVA, classic checkpoint keys, the saved
processor) and generates from a prompt plus `multi_modal_data={"image": PIL}`; its
greedy tokens and their logprobs match an HF forward of the same prompt. Skipped where
vLLM is not installed (the main .venv).
"""

from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("vllm")

from fp32 import ENGINE_PARITY
from temper.data.visual import VisualTasks
from temper.models import TINY_VLM_DIR, load_model, load_processor

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def llm():  # type: ignore[no-untyped-def]
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM

    engine = LLM(
        model=str(TINY_VLM_DIR),
        dtype="float32",
        enforce_eager=True,
        max_model_len=1024,
        enable_chunked_prefill=False,
        max_num_batched_tokens=8192,
        limit_mm_per_prompt={"image": 2},
        seed=0,
        disable_log_stats=True,
    )
    yield engine
    engine.llm_engine.engine_core.shutdown()


def test_vllm_generates_from_an_image_and_matches_an_hf_forward(llm):
    from vllm import SamplingParams

    processor, model = load_processor(TINY_VLM_DIR), load_model(TINY_VLM_DIR)
    tasks = VisualTasks().heldout(4)
    prompts = [
        processor.apply_chat_template(t.messages(), add_generation_prompt=True, tokenize=False)
        for t in tasks
    ]
    images = [t.prompt[0]["content"][0]["image"] for t in tasks]
    params = SamplingParams(max_tokens=8, temperature=0.0, logprobs=0)
    outputs = llm.generate(
        [
            {"prompt": p, "multi_modal_data": {"image": im}}
            for p, im in zip(prompts, images, strict=True)
        ],
        params,
    )
    for prompt, image, out in zip(prompts, images, outputs, strict=True):
        enc = processor(images=[image], text=[prompt], return_tensors="pt")
        assert list(out.prompt_token_ids) == enc["input_ids"][0].tolist()  # image tokens expanded
        sample = out.outputs[0]
        ids = list(sample.token_ids)
        assert ids and sample.text.startswith("\\boxed{")
        full = torch.cat([enc["input_ids"], torch.tensor([ids])], dim=1)
        with torch.no_grad():
            logits = model(
                input_ids=full,
                attention_mask=torch.ones_like(full),
                pixel_values=enc["pixel_values"],
            ).logits[0, enc["input_ids"].shape[1] - 1 : -1]
        hf = torch.log_softmax(logits, -1)
        assert hf.argmax(-1).tolist() == ids  # the same greedy tokens
        got = torch.tensor([step[t].logprob for step, t in zip(sample.logprobs, ids, strict=True)])
        torch.testing.assert_close(got, hf.gather(1, torch.tensor([ids]).T)[:, 0], **ENGINE_PARITY)
