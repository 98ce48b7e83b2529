"""How `temper.engine.vllm_engine.VLLMEngine` speaks to vLLM: the engine it
builds, each request's vLLM params, structured outputs and a quiet console.

Structured outputs: a `temper.engine.structured.StructuredOutput` becomes vLLM's
own ``StructuredOutputsParams``, on its xgrammar backend set up for compact JSON
(``disable_any_whitespace``, as the native engine's grammars are): a JSON schema
goes as ``json``, a forced tool call as the EBNF ``grammar`` of the very grammar
the native engine masks with (`temper.engine.structured.xgrammar_grammar`), so
both engines give the same ``<tool_call>{...}</tool_call>`` shape. A schema vLLM
will not take is refused before it reaches vLLM (where a bad request would fail
the whole batch), in one line naming the request field.

Outputs and weights: the sampled tokens' logprobs and the top-k alternatives out of
vLLM's per-position dicts, a running request's tokens so far (`SoFar`), the EOS ids,
and a state dict's tensors under the names vLLM's loader reads (`checkpoint_items`).

Console: vLLM logs about 60 info lines while it starts and shows a progress bar
while it loads weights. Both stay off unless ``TEMPER_VERBOSE=1`` (vLLM's warnings
still show; an explicit ``VLLM_LOGGING_LEVEL`` is honoured).

vLLM itself is imported inside the functions, never at module level.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch

from temper.engine.base import SamplingParams, TokenScores
from temper.engine.structured import StructuredOutput, xgrammar_grammar
from temper.errors import TemperError


def verbose() -> bool:
    """Whether vLLM may talk (``TEMPER_VERBOSE=1``); when not, its logger is set to
    WARNING (before vLLM is imported, through ``VLLM_LOGGING_LEVEL``, and after)."""
    if os.environ.get("TEMPER_VERBOSE", "0") not in ("", "0"):
        return True
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    logging.getLogger("vllm").setLevel(os.environ["VLLM_LOGGING_LEVEL"].upper())
    return False


def make_llm_engine(model_path: str, **opts: Any) -> Any:
    """An in-process `LLMEngine` for ``model_path`` (runs on the compute thread)."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.engine.llm_engine import LLMEngine

    args = EngineArgs(
        model=model_path,
        dtype=opts["dtype"],
        max_model_len=opts["max_context"],
        seed=opts["seed"],
        enable_prefix_caching=opts["prefix_caching"],
        gpu_memory_utilization=opts["gpu_memory_utilization"],
        enable_sleep_mode=opts["enable_sleep"],
        max_num_seqs=opts["max_num_seqs"],
        enforce_eager=True,
        # vLLM 0.32 on CPU: a seeded request whose prefill is split across steps fails
        # ("CPU Generator does not use offset"), so prompts are prefilled whole.
        enable_chunked_prefill=False,
        max_num_batched_tokens=max(8192, opts["max_context"] or 0),
        logprobs_mode="raw_logprobs",
        disable_log_stats=True,
        use_tqdm_on_load=opts["verbose"],
        structured_outputs_config={"backend": "xgrammar", "disable_any_whitespace": True},
        # [lora]: adapter updates as LoRAs, max_staleness + 1 versions at once (one more
        # cached while the oldest waits to be removed).
        enable_lora=opts["max_loras"] > 0,
        max_loras=max(opts["max_loras"], 1),
        max_cpu_loras=max(opts["max_loras"], 1) + 1,
        max_lora_rank=opts["max_lora_rank"],
    )
    return LLMEngine.from_engine_args(args)


def request_params(
    params: SamplingParams, index: int, max_tokens: int, resumes: int, structured: Any = None
) -> Any:
    """vLLM `SamplingParams` for sample ``index`` of a Temper request (``structured``:
    what `structured_outputs` made of ``params.structured``).

    A seeded request gives sample i its own stream (and a resumed sample a new one,
    so that it does not replay its first tokens).
    """
    from vllm import SamplingParams as VParams
    from vllm.sampling_params import RequestOutputKind

    seed = None
    if params.seed is not None:
        seed = (params.seed * 1_000_003 + index * 7919 + resumes * 104_729) % 2**63
    return VParams(
        n=1,
        temperature=params.temperature,
        top_p=params.top_p,
        top_k=params.top_k if params.top_k > 0 else 0,
        max_tokens=max_tokens,
        seed=seed,
        logprobs=params.top_logprobs,
        presence_penalty=params.presence_penalty,
        frequency_penalty=params.frequency_penalty,
        stop_token_ids=list(params.stop_token_ids),
        ignore_eos=params.ignore_eos,
        stop=list(params.stop_strings) or None,
        include_stop_str_in_output=True,
        skip_special_tokens=False,
        detokenize=bool(params.stop_strings),
        output_kind=RequestOutputKind.FINAL_ONLY,
        structured_outputs=structured,
    )


def scoring_params(top_logprobs: int) -> Any:
    """vLLM `SamplingParams` of a `score` call: the prompt's logprobs (raw, with the
    ``top_logprobs`` best at each position), and one greedy token vLLM must sample."""
    from vllm import SamplingParams as VParams
    from vllm.sampling_params import RequestOutputKind

    return VParams(
        n=1,
        temperature=0.0,
        max_tokens=1,
        prompt_logprobs=top_logprobs,
        detokenize=False,
        skip_special_tokens=False,
        output_kind=RequestOutputKind.FINAL_ONLY,
    )


def prompt_scores(out: Any, ids: list[int], k: int) -> TokenScores:
    """`TokenScores` from a finished request's ``prompt_logprobs`` (the first of which
    is None: the first token has no logprob)."""
    entries = list(out.prompt_logprobs or [])[1:]
    if len(entries) != len(ids) - 1:
        raise RuntimeError(
            f"vLLM returned {len(entries)} prompt logprobs for {len(ids)} scored ids"
        )
    logprobs = [float(entry[tok].logprob) for tok, entry in zip(ids[1:], entries, strict=True)]
    top = [_best(entry, k) for entry in entries] if k else None
    return TokenScores(logprobs, top)


def structured_outputs(output: StructuredOutput | None) -> Any:
    """vLLM's ``StructuredOutputsParams`` for ``output`` (None for None), checked as
    vLLM checks a request; a one-line `TemperError` for what vLLM cannot take."""
    if output is None:
        return None
    from vllm import SamplingParams as VParams
    from vllm.sampling_params import StructuredOutputsParams
    from vllm.v1.structured_output.backend_xgrammar import validate_xgrammar_grammar

    try:
        if output.kind == "json":
            params = StructuredOutputsParams(json=output.schema)
        else:
            params = StructuredOutputsParams(grammar=str(xgrammar_grammar(output)))
        validate_xgrammar_grammar(VParams(structured_outputs=params))
    except Exception as exc:  # vLLM's and xgrammar's errors for a schema they refuse
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        field = output.field or "structured output"
        raise TemperError(f"{field}: vLLM cannot take this schema: {first}") from None
    return params


__all__ = ["make_llm_engine", "request_params", "structured_outputs", "verbose"]


# ---------------------------------------------------------------- outputs and weights


def sampled_logprobs(comp: Any, ids: list[int]) -> list[float]:
    """The logprob of each sampled token, from vLLM's per-position dicts."""
    out: list[float] = []
    for tok, entry in zip(ids, comp.logprobs or [], strict=False):
        lp = entry.get(tok) if entry else None
        out.append(float(lp.logprob) if lp is not None else float("nan"))
    return out + [float("nan")] * (len(ids) - len(out))


def top_logprobs(comp: Any, ids: list[int], k: int) -> list[dict[int, float]]:
    """The k best alternatives at each position (vLLM adds the sampled token
    when it is not among them: dropped here by its rank)."""
    out = [_best(entry, k) for entry in list(comp.logprobs or [])[: len(ids)]]
    return out + [{} for _ in range(len(ids) - len(out))]


def _best(entry: Any, k: int) -> dict[int, float]:
    """The k best of one position's vLLM logprobs, by vLLM's rank (a token it added
    beyond them, the sampled or prompt one, ranks lower and drops out)."""
    best = sorted((entry or {}).items(), key=lambda kv: kv[1].rank or k + 1)
    return {int(t): float(lp.logprob) for t, lp in best[:k]}


class SoFar:
    """The tokens a running vLLM request has sampled so far, shaped like a finished output."""

    def __init__(self, state: Any) -> None:
        self.token_ids = list(state.detokenizer.output_token_ids)
        logprobs = state.logprobs_processor.logprobs or []
        self.logprobs = list(logprobs)[: len(self.token_ids)]


def checkpoint_items(state_dict: dict[str, torch.Tensor], hf_config: Any) -> list[tuple[str, Any]]:
    """HF-named tensors for vLLM's loader; a tied ``lm_head`` is sent as itself too.

    vLLM's CPU backend repacks linear weights (the lm_head included) into its own
    layout at load; with tied embeddings its loader skips ``lm_head.weight``, so
    the repacked head would keep the old weights. Sending the embedding under the
    head's name as well makes the head reload.
    """
    items = [(vllm_name(k, hf_config), v.detach()) for k, v in state_dict.items()]
    if getattr(hf_config, "tie_word_embeddings", False):
        embed = state_dict.get("model.embed_tokens.weight")
        if embed is not None and "lm_head.weight" not in state_dict:
            items.append(("lm_head.weight", embed.detach()))
    return items


#: Vision towers that transformers 5 keeps without their ``vision_model`` wrapper, while
#: vLLM 0.32's copies (and checkpoints saved before transformers 5) have it.
WRAPPED_TOWERS = ("clip_vision_model", "siglip_vision_model")


def vllm_name(name: str, hf_config: Any) -> str:
    """A trainer's in-memory tensor name as vLLM's loader reads it.

    The one difference met so far: a LLaVA vision tower's ``model.vision_tower.X``
    is ``model.vision_tower.vision_model.X`` to vLLM (its loader reports an unknown
    name otherwise). Everything else passes through.
    """
    vision = getattr(hf_config, "vision_config", None)
    prefix = "model.vision_tower."
    if (
        vision is not None
        and getattr(vision, "model_type", None) in WRAPPED_TOWERS
        and name.startswith(prefix)
        and not name.startswith(prefix + "vision_model.")
    ):
        return prefix + "vision_model." + name[len(prefix) :]
    return name


def eos_ids(hf_config: Any, tokenizer: Any) -> set[int]:
    ids: set[int] = set()
    eos = getattr(hf_config, "eos_token_id", None)
    if isinstance(eos, int):
        ids.add(eos)
    elif isinstance(eos, list):
        ids.update(int(x) for x in eos)
    tok_eos = getattr(tokenizer, "eos_token_id", None) if tokenizer is not None else None
    if isinstance(tok_eos, int):
        ids.add(tok_eos)
    return ids
