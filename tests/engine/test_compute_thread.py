"""All heavy torch work of a process runs on one OS thread (`temper.compute`)."""

import asyncio
import threading

import torch

from temper import compute
from temper.engine.base import SamplingParams
from temper.engine.llama_forward import LlamaFamilyModel
from temper.engine.native import NativeEngine
from temper.weights import push_weights

from .conftest import make_model


def test_run_executes_on_one_named_thread_and_nests_inline():
    ids = {compute.run(threading.get_ident) for _ in range(3)}
    assert len(ids) == 1 and ids != {threading.get_ident()}
    # A nested call from the compute thread runs inline instead of deadlocking.
    assert compute.run(lambda: compute.run(threading.get_ident)) in ids
    assert compute.run(lambda: threading.current_thread().name).startswith(compute.THREAD_NAME)


def test_set_threads_applies_to_the_compute_thread():
    before = compute.get_threads()
    try:
        compute.set_threads(1)
        assert compute.get_threads() == 1
    finally:
        compute.set_threads(before)


def test_native_engine_steps_and_weight_updates_run_on_the_compute_thread(monkeypatch):
    seen: list[str] = []
    for name in ("decode", "prefill", "load_state_dict"):
        original = getattr(LlamaFamilyModel, name)

        def spy(self, *args, _original=original, **kwargs):
            seen.append(threading.current_thread().name)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(LlamaFamilyModel, name, spy)
    model = make_model("llama")
    engine = NativeEngine(model)

    async def go():
        await engine.generate([5, 6, 7], SamplingParams(n=2, max_new_tokens=4, seed=0))
        push_weights(engine, {"model.norm.weight": torch.ones(64)}, version=1)
        await engine.close()

    asyncio.run(go())
    assert len(seen) >= 3
    assert all(name.startswith(compute.THREAD_NAME) for name in seen), seen
