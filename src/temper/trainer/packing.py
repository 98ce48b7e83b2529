"""Sequence packing: trajectories of mixed lengths in padding-free rows, prompts shared.

With ``trainer.packing = true`` a micro-batch is one row of at most
``trainer.micro_batch_tokens`` tokens, with no padding. A row holds *pieces*:
a distinct prompt once, then each of its responses (a GRPO group's samples,
multi-turn episodes whole with their loss masks). Position ids restart at 0
for every prompt, and each response continues at its prompt's length. The
attention is a forest, not just block-diagonal: a prompt sees itself
(causally); a response sees its own prompt and itself, never a sibling
response or another piece. So the shared-prompt saving of
`temper.trainer.batching` is kept (each prompt runs once per row) while the
padding, and the many small forwards of a long-tailed batch, go away.

The attention runs as variable-length attention over *segments*: one segment
per prompt (its own keys) and one per response (its prompt's keys, then its
own), each causal aligned bottom-right. `packed_attention` is registered with
transformers' `AttentionInterface`, so any HF decoder that routes attention
through it (Llama, Qwen2/3, Mistral...) runs packed rows without other
changes: on CUDA through ``torch.nn.attention.varlen.varlen_attn`` (Flash
Attention; untested here, no GPU), elsewhere through one SDPA call per
segment, which skips the masked-out blocks a dense block mask would compute.

Planning is deterministic and depends only on the rows' contents. Across
data-parallel ranks, whole groups are spread by tokens with the largest
differencing method (Karmarkar–Karp) in `partition_by_tokens`; within a rank,
pieces go into rows first-fit decreasing.

Vision-language rows are not packed: `PolicyTrainer` keeps today's path for
vision-language models and for trajectories with images (`holds_images`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import heapq
import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from transformers import AttentionInterface

from temper.records import Trajectory
from temper.trainer.batching import tensor_fields_to

#: The name `packed_attention` is registered under (a model runs it inside `packed_forward`).
ATTENTION_NAME = "temper_packed"


def holds_images(trajs: Sequence[Trajectory]) -> bool:
    """Whether any trajectory shows an image (those train unpacked)."""
    return any(t.images for t in trajs)


def _fed_tokens(t: Trajectory) -> int:
    """Response tokens fed to the model: all but the last (nothing is predicted after it)."""
    return max(len(t.response_ids) - 1, 0)


def _groups(trajs: Sequence[Trajectory], rows: Sequence[int]) -> dict[tuple, list[int]]:
    """``rows`` by prompt, in order of first appearance."""
    groups: dict[tuple, list[int]] = {}
    for i in rows:
        groups.setdefault(trajs[i].prompt_key(), []).append(i)
    return groups


def _content(t: Trajectory) -> tuple:
    return (t.prompt_ids, t.response_ids)


# --- balance across ranks ---------------------------------------------------------------


def partition_by_tokens(weights: Sequence[int], parts: int) -> list[list[int]]:
    """Indices of ``weights`` split into ``parts`` lists with near-equal sums.

    The largest differencing method (Karmarkar & Karp, 1982), k-way: every item
    starts as a k-tuple of subsets (itself, then empties); the two tuples with
    the largest spread (max sum - min sum) are merged, the heaviest subset of
    one with the lightest of the other, until one tuple is left. Ties are
    broken by creation order, so equal inputs give equal plans. The parts come
    out heaviest first; the items in each are sorted.
    """
    if parts < 1:
        raise ValueError(f"parts must be >= 1, got {parts}")
    heap: list[tuple[int, int, list[tuple[int, list[int]]]]] = []
    for seq, i in enumerate(sorted(range(len(weights)), key=lambda i: (-weights[i], i))):
        subsets = [(weights[i], [i])] + [(0, []) for _ in range(parts - 1)]
        heap.append((-weights[i], seq, subsets))
    heapq.heapify(heap)
    seq = len(heap)
    while len(heap) > 1:
        _, _, a = heapq.heappop(heap)
        _, _, b = heapq.heappop(heap)
        a = sorted(a, key=lambda s: -s[0])
        b = sorted(b, key=lambda s: s[0])
        merged = [(sa + sb, ia + ib) for (sa, ia), (sb, ib) in zip(a, b, strict=True)]
        spread = max(s for s, _ in merged) - min(s for s, _ in merged)
        heapq.heappush(heap, (-spread, seq, merged))
        seq += 1
    if not heap:
        return [[] for _ in range(parts)]
    final = sorted(heap[0][2], key=lambda s: (-s[0], sorted(s[1])))
    return [sorted(items) for _, items in final]


def shard_by_tokens(
    trajs: Sequence[Trajectory], rows: Sequence[int], world: int
) -> list[list[int]]:
    """``rows`` split over ``world`` ranks by tokens, whole groups per rank (a shared
    prompt stays on one rank). Deterministic: groups are ordered by content first."""
    groups = sorted(
        _groups(trajs, rows).values(), key=lambda g: sorted(_content(trajs[i]) for i in g)
    )
    weights = [len(trajs[g[0]].prompt_ids) + sum(_fed_tokens(trajs[i]) for i in g) for g in groups]
    return [
        sorted(i for k in part for i in groups[k]) for part in partition_by_tokens(weights, world)
    ]


# --- rows within a rank -----------------------------------------------------------------


def _pieces(
    trajs: Sequence[Trajectory], group: list[int], budget: int
) -> list[tuple[int, list[int]]]:
    """A group cut into (tokens, rows) pieces of at most ``budget`` tokens, each paying for
    the prompt once; first-fit decreasing. A response too long for any piece gets its own."""
    prompt = len(trajs[group[0]].prompt_ids)
    order = sorted(group, key=lambda i: (-_fed_tokens(trajs[i]), _content(trajs[i]), i))
    pieces: list[tuple[int, list[int]]] = []
    for i in order:
        need = _fed_tokens(trajs[i])
        for k, (tokens, members) in enumerate(pieces):
            if tokens + need <= budget:
                pieces[k] = (tokens + need, [*members, i])
                break
        else:
            pieces.append((prompt + need, [i]))
    return pieces


def plan_packed_rows(trajs: Sequence[Trajectory], token_budget: int) -> list[list[int]]:
    """Positions in ``trajs`` grouped into packed rows of at most ``token_budget`` fed tokens
    (a prompt once per row, responses less their last token).

    Groups are cut into pieces that fit (`_pieces`), and pieces go into rows first-fit
    decreasing. A piece larger than the budget (one long trajectory) gets a row to itself.
    The plan depends only on the rows' contents, not their order.
    """
    groups = _groups(trajs, range(len(trajs)))
    pieces = [p for g in groups.values() for p in _pieces(trajs, g, token_budget)]
    pieces.sort(key=lambda p: (-p[0], [_content(trajs[i]) for i in p[1]]))
    bins: list[tuple[int, list[int]]] = []
    for tokens, members in pieces:
        for k, (used, rows) in enumerate(bins):
            if used + tokens <= token_budget:
                bins[k] = (used + tokens, rows + members)
                break
        else:
            bins.append((tokens, list(members)))
    return [rows for _, rows in bins]


# --- one packed micro-batch -------------------------------------------------------------


@dataclass
class PackedLayout:
    """Which keys each query segment of a packed row sees (what `packed_attention` reads).

    Segment s has queries ``cu_q[s]:cu_q[s+1]`` of the row and keys
    ``key_index[cu_k[s]:cu_k[s+1]]``; a query sees the keys up to its own
    position, aligned to the end of the key list (causal, bottom-right).
    """

    key_index: torch.Tensor
    cu_q: torch.Tensor
    cu_k: torch.Tensor
    max_q: int
    max_k: int

    def segments(self) -> Iterator[tuple[int, int, int, int]]:
        yield from zip(
            self.cu_q[:-1].tolist(),
            self.cu_q[1:].tolist(),
            self.cu_k[:-1].tolist(),
            self.cu_k[1:].tolist(),
            strict=True,
        )

    def to(self, device: torch.device) -> PackedLayout:
        return dataclasses.replace(
            self,
            key_index=self.key_index.to(device),
            cu_q=self.cu_q.to(device),
            cu_k=self.cu_k.to(device),
        )


@dataclass
class PackedMicroBatch:
    """One packed row and the per-response tensors of `temper.trainer.batching.MicroBatch`.

    ``input_ids``/``position_ids`` are ``[1, T]``. ``keep`` lists the row
    positions whose logits are needed. The logits come back flat, one per
    response token (``[N, vocab]``, N the batch's response tokens, row-major):
    ``flat_index [N]`` says which kept position predicts each, ``targets`` is
    those tokens, and `to_rows` lays per-token values out as ``[B, R]``
    (``valid`` marks the real tokens). Flat, because rows of mixed lengths
    padded to ``[B, R, vocab]`` would cost more than the packing saves.
    ``response_ids``, ``loss_mask``, ``advantages`` and ``behaviour_logprobs``
    are ``[B, R]`` as in `MicroBatch`.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    layout: PackedLayout
    keep: torch.Tensor
    flat_index: torch.Tensor
    valid: torch.Tensor
    response_ids: torch.Tensor
    loss_mask: torch.Tensor
    advantages: torch.Tensor
    behaviour_logprobs: torch.Tensor
    indices: list[int]

    @property
    def targets(self) -> torch.Tensor:
        """The response tokens ``[N]``, in the order of the flat logits."""
        return self.response_ids[self.valid]

    def to_rows(self, per_token: torch.Tensor) -> torch.Tensor:
        """Flat per-token values ``[N]`` as ``[B, R]``, zero past each response's end."""
        return per_token.new_zeros(self.valid.shape).masked_scatter(self.valid, per_token)

    def to(self, device: torch.device) -> PackedMicroBatch:
        if device.type == "cpu":
            return self
        moved = tensor_fields_to(self, device)
        return dataclasses.replace(self, **moved, layout=self.layout.to(device))


def collate_packed(
    trajs: Sequence[Trajectory], indices: list[int], pad_id: int
) -> PackedMicroBatch:
    """The packed row of ``trajs[i] for i in indices``: each distinct prompt once, followed
    by its responses (less their last token). Response b of the result is ``indices[b]``."""
    if holds_images([trajs[i] for i in indices]):
        raise ValueError("trajectories with images are not packed: collate them with `collate`")
    ids: list[int] = []
    pos: list[int] = []
    keys: list[int] = []
    cu_q, cu_k = [0], [0]
    needed: dict[int, list[int]] = {}  # row of the result -> row positions predicting its tokens
    slot = {i: b for b, i in enumerate(indices)}
    for group in _groups(trajs, indices).values():
        prompt = trajs[group[0]].prompt_ids
        if not prompt:
            raise ValueError(f"trajectory {trajs[group[0]].task_id}: empty prompt")
        start, p = len(ids), len(prompt)
        prompt_keys = list(range(start, start + p))
        ids += prompt
        pos += range(p)
        keys += prompt_keys
        cu_q.append(len(ids))
        cu_k.append(len(keys))
        for i in group:
            fed = trajs[i].response_ids[:-1]
            s = len(ids)
            needed[slot[i]] = [start + p - 1, *range(s, s + len(fed))][: len(trajs[i].response_ids)]
            if not fed:
                continue
            ids += fed
            pos += range(p, p + len(fed))
            keys += prompt_keys + list(range(s, s + len(fed)))
            cu_q.append(len(ids))
            cu_k.append(len(keys))
    keep = sorted({q for rows in needed.values() for q in rows})
    where = {q: k for k, q in enumerate(keep)}
    width = max(1, max(len(trajs[i].response_ids) for i in indices))
    shape = (len(indices), width)
    valid = torch.zeros(shape, dtype=torch.bool)
    flat_index: list[int] = []
    response_ids = torch.full(shape, pad_id, dtype=torch.long)
    loss_mask = torch.zeros(shape, dtype=torch.float32)
    advantages = torch.zeros(shape, dtype=torch.float32)
    behaviour = torch.zeros(shape, dtype=torch.float32)
    for b, i in enumerate(indices):
        t, r = trajs[i], len(trajs[i].response_ids)
        valid[b, :r] = True
        flat_index += [where[q] for q in needed[b]]
        response_ids[b, :r] = torch.tensor(t.response_ids, dtype=torch.long)
        loss_mask[b, :r] = torch.tensor(t.loss_mask, dtype=torch.float32)
        advantages[b, :r] = torch.tensor(t.advantage_row())
        behaviour[b, :r] = torch.tensor(t.behaviour_logprobs, dtype=torch.float32)
    q_len = [b - a for a, b in itertools.pairwise(cu_q)]
    k_len = [b - a for a, b in itertools.pairwise(cu_k)]
    layout = PackedLayout(
        key_index=torch.tensor(keys, dtype=torch.long),
        cu_q=torch.tensor(cu_q, dtype=torch.int32),
        cu_k=torch.tensor(cu_k, dtype=torch.int32),
        max_q=max(q_len),
        max_k=max(k_len),
    )
    return PackedMicroBatch(
        input_ids=torch.tensor([ids], dtype=torch.long),
        position_ids=torch.tensor([pos], dtype=torch.long),
        layout=layout,
        keep=torch.tensor(keep, dtype=torch.long),
        flat_index=torch.tensor(flat_index, dtype=torch.long),
        valid=valid,
        response_ids=response_ids,
        loss_mask=loss_mask,
        advantages=advantages,
        behaviour_logprobs=behaviour,
        indices=list(indices),
    )


def pad_packed(mb: PackedMicroBatch, width: int, pad_id: int) -> PackedMicroBatch:
    """``mb`` with its row right-padded to ``width`` tokens: the padding is one more
    segment that attends only to itself and predicts nothing, so the logits of the
    real tokens are unchanged. (Pipeline stages need one activation shape for every
    micro-batch.)"""
    length = mb.input_ids.shape[1]
    extra = width - length
    if extra < 0:
        raise ValueError(f"a packed row of {length} tokens does not fit in {width}")
    if extra == 0:
        return mb
    layout = mb.layout
    pad_keys = torch.arange(length, width, dtype=layout.key_index.dtype)
    return dataclasses.replace(
        mb,
        input_ids=torch.nn.functional.pad(mb.input_ids, (0, extra), value=pad_id),
        position_ids=torch.cat(
            (mb.position_ids, torch.arange(extra, dtype=mb.position_ids.dtype)[None]), dim=1
        ),
        layout=PackedLayout(
            key_index=torch.cat((layout.key_index, pad_keys)),
            cu_q=torch.cat((layout.cu_q, layout.cu_q.new_tensor([width]))),
            cu_k=torch.cat((layout.cu_k, layout.cu_k.new_tensor([len(layout.key_index) + extra]))),
            max_q=max(layout.max_q, extra),
            max_k=max(layout.max_k, extra),
        ),
    )


# --- the forward ------------------------------------------------------------------------


def packed_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    packed: PackedLayout | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers attention over a packed row: ``query`` ``[1, H, T, D]`` and ``key``/
    ``value`` ``[1, Hkv, T, D]`` to ``[1, T, H, D]``, segment by segment (`PackedLayout`)."""
    if packed is None:
        raise ValueError(
            "packed_attention needs the row's layout: run the model via packed_forward"
        )
    q = query[0]
    k = key[0].index_select(1, packed.key_index)
    v = value[0].index_select(1, packed.key_index)
    gqa = q.shape[0] != k.shape[0]
    if q.is_cuda and dropout == 0.0:
        from torch.nn.attention.varlen import varlen_attn

        out = varlen_attn(
            q.transpose(0, 1).contiguous(),
            k.transpose(0, 1).contiguous(),
            v.transpose(0, 1).contiguous(),
            packed.cu_q,
            packed.cu_k,
            packed.max_q,
            packed.max_k,
            scale=scaling,
            window_size=(-1, 0),
            enable_gqa=gqa,
        )
        return out.unsqueeze(0), None
    outs = []
    for q0, q1, k0, k1 in packed.segments():
        lq, lk = q1 - q0, k1 - k0
        mask = None
        if lq != lk:  # causal, aligned to the last key (SDPA's is_causal aligns to the first)
            mask = torch.ones(lq, lk, dtype=torch.bool, device=q.device).tril(lk - lq)
        outs.append(
            torch.nn.functional.scaled_dot_product_attention(
                q[:, q0:q1],
                k[:, k0:k1],
                v[:, k0:k1],
                attn_mask=mask,
                dropout_p=dropout,
                is_causal=mask is None,
                scale=scaling,
                enable_gqa=gqa,
            )
        )
    return torch.cat(outs, dim=1).transpose(0, 1).unsqueeze(0), None


AttentionInterface.register(ATTENTION_NAME, packed_attention)


@contextlib.contextmanager
def attention_implementation(model: torch.nn.Module, name: str) -> Iterator[None]:
    config = model.config
    before = config._attn_implementation
    config._attn_implementation = name
    try:
        yield
    finally:
        config._attn_implementation = before


def packed_logits(model: torch.nn.Module, mb: PackedMicroBatch) -> torch.Tensor:
    """Float32 logits ``[N, vocab]``, one row per response token (``mb.targets``), flat;
    the same numbers `temper.trainer.forward.response_logits` gives as ``[B, R, vocab]``."""
    with attention_implementation(model, ATTENTION_NAME):
        logits = model(
            input_ids=mb.input_ids,
            position_ids=mb.position_ids,
            use_cache=False,
            logits_to_keep=mb.keep,
            packed=mb.layout,
        ).logits[0]
    return logits.index_select(0, mb.flat_index).float()
