"""Grammar-constrained output for the OpenAI server: JSON and forced tool calls.

`Grammars(tokenizer)` turns a request's ``response_format`` (``json_object``,
``json_schema``) or forced ``tool_choice`` ("required" or a named function)
into a `temper.engine.base.LogitsProcessorFactory`. Each sample gets its own
`GrammarProcessor`, an xgrammar matcher that masks every token the grammar
cannot take next; once the grammar is complete only the tokenizer's
end-of-sequence token is allowed, so the sample ends there.

The grammars are compact: JSON is generated without free whitespace
(``any_whitespace=False``), so a weak model cannot spend its tokens on blanks.
A forced tool call is exactly one Hermes block, ``<tool_call>{"name": ...,
"arguments": {...}}</tool_call>``, whose arguments follow the tool's
parameter schema. A sample that hits ``max_tokens`` first is cut like any
other (finish_reason "length") and its JSON is then incomplete.

The request's shape is first declared (`temper.engine.structured`); this module
turns the declaration into processors for engines that run them (the native
engine). An engine with ``abilities.structured_outputs`` (vLLM) takes the
declaration itself, and `Grammars.check` only refuses here, with the same 400,
what xgrammar cannot take.

xgrammar is an optional dependency (``pip install temper-rl[grammar]``);
without it these requests are refused with a 400 that says so.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable
from typing import Any

import torch

from temper.engine.base import LogitsProcessor
from temper.engine.structured import StructuredOutput, tool_call_output, xgrammar_grammar
from temper.serve.protocol import APIError

#: Compiled grammars kept per server (by their JSON key); compiling costs milliseconds
#: for small vocabularies and more for large ones, and clients repeat their schemas.
CACHE_SIZE = 64
_SOURCE_PREFIX = re.compile(r"^\[[\d:]+\] \S+:\d+: ")


class GrammarProcessor:
    """One sample's grammar state: masks the logits, advances on each drawn token."""

    def __init__(self, compiled: Any, vocab: int) -> None:
        import xgrammar as xgr

        self._xgr = xgr
        self.matcher = xgr.GrammarMatcher(compiled)
        self.vocab = vocab
        self.bitmask = xgr.allocate_token_bitmask(1, vocab)

    def apply(self, logits: torch.Tensor) -> None:
        if self.matcher.is_terminated():
            return  # finished: the engine stops the sample on the end token it just drew
        self.matcher.fill_next_token_bitmask(self.bitmask)
        # Model rows can be wider than the tokenizer (padded embeddings): never those.
        logits[self.vocab :] = float("-inf")
        self._xgr.apply_token_bitmask_inplace(logits[: self.vocab].unsqueeze(0), self.bitmask)

    def accept(self, token_id: int) -> None:
        if not self.matcher.is_terminated():
            self.matcher.accept_token(token_id)


class Grammars:
    """Compiles request grammars for one tokenizer (thread-safe, with a small cache)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.vocab = len(tokenizer)
        self._compiler: Any = None
        self._cache: dict[str, Any] = {}
        self._lock = threading.Lock()

    def _compiler_or_refuse(self, param: str) -> Any:
        if self._compiler is None:
            try:
                import xgrammar as xgr
            except ImportError:
                raise APIError(
                    f"{param} needs the xgrammar package on the server "
                    "(pip install 'temper-rl[grammar]')",
                    param=param,
                ) from None
            info = xgr.TokenizerInfo.from_huggingface(self.tokenizer, vocab_size=self.vocab)
            self._compiler = xgr.GrammarCompiler(info)
        return self._compiler

    def _compiled(self, key: str, param: str, build: Callable[[Any], Any]) -> Any:
        with self._lock:
            compiler = self._compiler_or_refuse(param)
            if key not in self._cache:
                try:
                    compiled = build(compiler)
                except Exception as exc:  # xgrammar's errors for schemas it cannot compile
                    raise _cannot(exc, param) from None
                if len(self._cache) >= CACHE_SIZE:
                    self._cache.pop(next(iter(self._cache)))
                self._cache[key] = compiled
            return self._cache[key]

    def _factory(self, compiled: Any) -> Callable[[], LogitsProcessor]:
        vocab = self.vocab
        return lambda: GrammarProcessor(compiled, vocab)

    def processors(self, output: StructuredOutput) -> Callable[[], LogitsProcessor]:
        """The processor factory that holds samples to ``output`` (its ``field`` names
        the request field in a refusal)."""
        param = output.field or "response_format"
        if output.kind == "json":
            return self.json_schema(output.schema_dict, param)
        key = "tool:" + json.dumps(output.schema_dict, sort_keys=True)

        def build(compiler: Any) -> Any:
            return compiler.compile_grammar(xgrammar_grammar(output))

        return self._factory(self._compiled(key, param, build))

    def check(self, output: StructuredOutput) -> None:
        """Refuse (a 400, as `processors` would) an ``output`` xgrammar cannot take,
        without compiling it for the tokenizer: for an engine that compiles its own."""
        param = output.field or "response_format"
        self._compiler_or_refuse(param)
        try:
            xgrammar_grammar(output)
        except Exception as exc:  # xgrammar's errors for schemas it cannot take
            raise _cannot(exc, param) from None

    def json_schema(self, schema: dict[str, Any], param: str) -> Callable[[], LogitsProcessor]:
        """Output is one JSON value valid under ``schema``."""
        key = "schema:" + json.dumps(schema, sort_keys=True)
        compiled = self._compiled(
            key, param, lambda c: c.compile_json_schema(schema, any_whitespace=False)
        )
        return self._factory(compiled)

    def tool_call(self, tools: list[dict[str, Any]], param: str) -> Callable[[], LogitsProcessor]:
        """Output is one Hermes ``<tool_call>{json}</tool_call>`` calling one of ``tools``."""
        return self.processors(tool_call_output(tools, param))


def _cannot(exc: BaseException, param: str) -> APIError:
    """The one-line 400 for a grammar xgrammar cannot build."""
    first = (str(exc).splitlines() or [type(exc).__name__])[0]
    first = _SOURCE_PREFIX.sub("", first)  # "[time] file.cc:line: "
    return APIError(f"{param}: cannot build a grammar: {first}", param=param)
