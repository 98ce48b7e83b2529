"""`stream_weights` outside a process group: buckets, every tensor copied, ties once.
(Across FSDP2 and TP ranks it runs in tests/trainer/test_distributed.py and
test_tensor_parallel.py, whose weight comparisons read the streamed copy.)"""

import torch

from temper.models import load_model
from temper.trainer.weight_stream import _buckets, stream_weights


def test_buckets_hold_at_most_their_bytes_and_a_big_tensor_alone():
    tensors = [(f"t{i}", torch.zeros(n)) for i, n in enumerate([10, 10, 30, 5, 5])]
    groups = [[name for name, _ in b] for b in _buckets(tensors, bucket_bytes=80)]
    assert groups == [["t0", "t1"], ["t2"], ["t3", "t4"]]  # 40+40, 120 alone, 20+20


def test_every_tensor_reaches_the_sink_and_a_tied_head_is_gathered_once():
    model = load_model("tiny")
    assert model.lm_head.weight is model.model.embed_tokens.weight  # the tiny model ties them
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.5)
    target = load_model("tiny")
    sink = dict(target.state_dict())
    embed = model.model.embed_tokens.weight
    largest = stream_weights(model, sink, bucket_bytes=embed.numel() * 4)
    for name, value in model.state_dict().items():
        assert torch.equal(sink[name], value), name
    assert largest == embed.numel() * 4  # no bucket held more than the largest tensor
