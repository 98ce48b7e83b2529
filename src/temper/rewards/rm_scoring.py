"""Scoring (prompt, response) pairs with a sequence-classification reward model.

`score_pairs_each` is what the reward-model batcher runs on the compute
thread: one tokenizer call, rows sorted by token length, one padded forward
per `length_groups` group, so a short pair never pays for a long one's padding.
It returns one result per pair, a float or the exception that pair alone
caused, so one bad pair cannot fail the pairs batched beside it:

- when the batch's tokenizer call fails, each pair is tokenized on its own and
  the ones that still fail get `UnscorablePair` (the request's fault: HTTP 400);
- when a group's forward fails, its rows are run one by one and the ones that
  still fail get `RuntimeError` (the server's fault: HTTP 500).

A text far longer than the model's ``max_length`` is cut (`cut_text`) before
tokenizing, so a huge text costs no more than one that just fills the context;
the tokens kept by truncation are the same.
`score_pairs` is the all-or-nothing form: floats, or the first error raised.
"""

from __future__ import annotations

from typing import Any

import torch

from temper.models.loader import longest_token_chars

#: What one extra forward costs, in padded tokens: a forward's fixed Python
#: and dispatch work on CPU takes about as long as the tiny RM spends on this
#: many tokens. `length_groups` splits a batch where padding would cost more.
SPLIT_COST_TOKENS = 64

#: Tokens kept beyond ``max_length`` when a long text is cut before tokenizing,
#: so the cut (which may split a word) lies well past what truncation keeps.
CUT_MARGIN_TOKENS = 16


class UnscorablePair(ValueError):
    """A pair the tokenizer refuses even on its own; the message says why."""


def length_groups(lengths: list[int], split_cost: int = SPLIT_COST_TOKENS) -> list[int]:
    """Where to cut ``lengths`` (sorted ascending) into separately padded forwards.

    Returns the end index of each group. A group grows while the padding that
    the next row adds to it (``rows so far * length increase``) stays within
    ``split_cost`` tokens; otherwise the next row starts a new group. Equal
    lengths never split, so a batch of similar texts is one forward.
    """
    ends: list[int] = []
    start = 0
    for i in range(1, len(lengths)):
        if (i - start) * (lengths[i] - lengths[i - 1]) > split_cost:
            ends.append(i)
            start = i
    return [*ends, len(lengths)] if lengths else []


def _padded(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask) of ``rows`` right-padded to the longest, without a per-row loop."""
    lengths = torch.tensor([len(r) for r in rows])
    mask = torch.arange(int(lengths.max())) < lengths[:, None]
    ids = torch.full(mask.shape, pad_id, dtype=torch.long)
    ids[mask] = torch.tensor([t for r in rows for t in r], dtype=torch.long)
    return ids, mask.long()


def cut_text(text: str, tokenizer: Any, max_length: int | None) -> str:
    """``text``, or its start when it is so long that truncation to ``max_length``
    tokens would drop the rest anyway (more than ``max_length + CUT_MARGIN_TOKENS``
    tokens' worth of characters; see `temper.models.loader.longest_token_chars`)."""
    if max_length is None:
        return text
    keep = (max_length + CUT_MARGIN_TOKENS) * longest_token_chars(tokenizer)
    return text if len(text) <= keep else text[:keep]


def _first_line(exc: BaseException) -> str:
    text = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), "")
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _tokenize(
    tokenizer: Any, pairs: list[tuple[str, str]], max_length: int | None
) -> list[list[int] | Exception]:
    kwargs: dict[str, Any] = {}
    if max_length is not None:
        kwargs.update(truncation=True, max_length=max_length)
    prompts = [cut_text(p, tokenizer, max_length) for p, _ in pairs]
    responses = [cut_text(r, tokenizer, max_length) for _, r in pairs]
    try:
        return list(tokenizer(prompts, responses, **kwargs)["input_ids"])
    except Exception:  # some pair is refused: find which, one at a time
        pass
    out: list[list[int] | Exception] = []
    for prompt, response in zip(prompts, responses, strict=True):
        try:
            out.append(list(tokenizer(prompt, response, **kwargs)["input_ids"]))
        except Exception as exc:
            out.append(UnscorablePair(f"the tokenizer refuses it ({_first_line(exc)})"))
    return out


def _forward(model: Any, rows: list[list[int]], pad_id: int) -> list[float]:
    device = next(model.parameters()).device
    input_ids, mask = _padded(rows, pad_id)
    with torch.inference_mode():
        logits = model(input_ids=input_ids.to(device), attention_mask=mask.to(device)).logits
    return logits[:, 0].float().cpu().tolist()


def score_pairs_each(
    model: Any, tokenizer: Any, pairs: list[tuple[str, str]], max_length: int | None = None
) -> list[float | Exception]:
    """The model's first logit for each pair, in order, or that pair's own error
    (call on the compute thread; see the module doc)."""
    if not pairs:
        return []
    encoded = _tokenize(tokenizer, pairs, max_length)
    results: list[float | Exception] = [e if isinstance(e, Exception) else 0.0 for e in encoded]
    for i, e in enumerate(encoded):
        if not isinstance(e, Exception) and not e:
            results[i] = UnscorablePair("it tokenizes to zero tokens")
    ids = {i: e for i, e in enumerate(encoded) if not isinstance(results[i], Exception)}
    order = sorted(ids, key=lambda i: len(ids[i]))
    pad = tokenizer.pad_token_id
    start = 0
    for end in length_groups([len(ids[i]) for i in order]):
        rows, start = order[start:end], end
        try:
            scores = _forward(model, [ids[i] for i in rows], pad)
        except Exception:  # find the row(s) that fail on their own
            for i in rows:
                results[i] = _forward_one(model, ids[i], pad)
            continue
        for i, value in zip(rows, scores, strict=True):
            results[i] = value
    return results


def _forward_one(model: Any, row: list[int], pad: int) -> float | Exception:
    try:
        return _forward(model, [row], pad)[0]
    except Exception as exc:
        return RuntimeError(f"reward-model forward failed: {exc!r}")


def score_pairs(
    model: Any, tokenizer: Any, pairs: list[tuple[str, str]], max_length: int | None = None
) -> list[float]:
    """`score_pairs_each`, but raising the first pair's error instead of returning it."""
    results = score_pairs_each(model, tokenizer, pairs, max_length)
    for r in results:
        if isinstance(r, Exception):
            raise r
    return [float(r) for r in results]
