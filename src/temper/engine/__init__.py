"""temper.engine: generation engines behind one protocol (token ids in, token ids + logprobs out).

`Engine` (`temper.engine.base`) is the protocol; its implementations are
`NativeEngine` (`native`: the PyTorch engine with a slot KV cache and continuous
batching), `HFEngine` (`hf`: Hugging Face ``model.generate``, the baseline),
`VLLMEngine` (`vllm_engine`: vLLM in this process; `vllm_extras`, and `vllm_lora` for
adapter updates as vLLM LoRAs) and `OpenAIEndpointEngine`
(`openai_endpoint`: a remote OpenAI-compatible completions endpoint; no local
model, no weight updates). A run builds its engine from config in
`temper.builder.engines`; tests and scripts construct them directly.
"""

from temper.engine.base import Engine, GenerationResult, SampleOutput, SamplingParams

__all__ = ["Engine", "GenerationResult", "SampleOutput", "SamplingParams"]
