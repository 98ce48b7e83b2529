"""The reward-model server: dynamic batching of a real tiny sequence-classification model,
over HTTP and in process, with overload, shutdown and client-retry behaviour."""

from __future__ import annotations

import asyncio
import socket

import httpx
import pytest
import torch

from ports import free_port
from temper import compute
from temper.records import Task
from temper.rewards.base import Reward, RewardInput
from temper.rewards.reward_model import RewardModelReward
from temper.rewards.rm_batcher import (
    BatcherClosed,
    Overloaded,
    RewardModelBatcher,
    load_reward_model,
)
from temper.rewards.rm_scoring import length_groups, score_pairs
from temper.serve.reward_model import parse_score_request, start_rm_server

PAIRS = [
    ("What is 2+3?", "5"),
    ("Name a colour.", "Blue is a colour that many people like a lot."),
    ("Say hi", "hi"),
    ("Write a long answer please, with several words in it.", "Sure: one two three four five."),
    ("", "empty prompt"),
    ("x", ""),
]


@pytest.fixture(scope="module")
def rm_dir(tmp_path_factory):
    from transformers import LlamaConfig, LlamaForSequenceClassification

    from temper.models import load_tokenizer

    tok = load_tokenizer("tiny")
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        num_labels=1,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(0)
    model = LlamaForSequenceClassification(cfg)
    path = tmp_path_factory.mktemp("rm")
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def loaded(rm_dir):
    return load_reward_model(rm_dir)


@pytest.fixture(scope="module")
def expected(loaded):
    model, tok = loaded
    return {p: compute.run(score_pairs, model, tok, [p])[0] for p in PAIRS}


def _task() -> Task:
    return Task(id="t", prompt=[{"role": "user", "content": "q"}])


def test_batched_scores_equal_unbatched_in_any_order(loaded, expected):
    model, tok = loaded

    async def go(order):
        batcher = RewardModelBatcher(model, tok, max_batch_size=4, max_wait_ms=20)
        try:
            scores = await batcher.score(order)
        finally:
            await batcher.close()
        return scores, batcher.forwards

    for order in (PAIRS, PAIRS[::-1], PAIRS[2:] + PAIRS[:2]):
        scores, forwards = asyncio.run(go(order))
        assert forwards == 2  # 6 pairs, batches of 4
        for pair, got in zip(order, scores, strict=True):
            assert got == pytest.approx(expected[pair], rel=1e-5, abs=1e-5)


def test_overload_and_close_fail_fast(loaded):
    model, tok = loaded

    async def go():
        batcher = RewardModelBatcher(model, tok, max_batch_size=2, max_wait_ms=10_000, max_queue=3)
        first = asyncio.ensure_future(batcher.score(PAIRS[:1]))
        await asyncio.sleep(0.01)
        with pytest.raises(Overloaded, match="max_queue=3"):
            await batcher.score(PAIRS[:3])
        await batcher.close()
        with pytest.raises(BatcherClosed, match="shutting down"):
            await asyncio.wait_for(first, 5)

    asyncio.run(go())


def test_http_concurrent_clients_batching_health(rm_dir, expected):
    handle, batcher = start_rm_server(rm_dir, max_batch_size=16, max_wait_ms=20)
    try:
        health = httpx.get(f"{handle.url}/health").json()
        assert health["status"] == "ok"

        async def client(i, http):
            pair = PAIRS[i % len(PAIRS)]
            body = {"pairs": [{"prompt": pair[0], "response": pair[1]}]}
            reply = await http.post(f"{handle.url}/score", json=body)
            reply.raise_for_status()
            return pair, reply.json()["scores"][0]

        async def go():
            async with httpx.AsyncClient(timeout=30) as http:
                return await asyncio.gather(*(client(i, http) for i in range(24)))

        for pair, got in asyncio.run(go()):
            assert got == pytest.approx(expected[pair], rel=1e-5, abs=1e-5)
        assert batcher.scored == 24
        assert batcher.forwards < 24

        bad = httpx.post(f"{handle.url}/score", json={"pairs": [{"prompt": "x"}]})
        assert bad.status_code == 400
        assert "pairs.0.response" in bad.json()["error"]["message"]
        assert "\n" not in bad.json()["error"]["message"]
        assert httpx.post(f"{handle.url}/score", json={"pairs": []}).json() == {"scores": []}
    finally:
        handle.stop()
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{handle.url}/health", timeout=2)


def test_http_overload_is_503_and_a_request_larger_than_the_queue_is_413(loaded):
    """A full queue is 503 (retry later); a request with more pairs than the queue
    holds can never succeed, so it is a 413 that clients do not retry."""
    handle, batcher = start_rm_server(loaded, max_batch_size=3, max_wait_ms=60_000, max_queue=3)

    def body(pairs):
        return {"pairs": [{"prompt": p, "response": r} for p, r in pairs]}

    try:
        reply = httpx.post(f"{handle.url}/score", json=body(PAIRS[:4]))
        assert reply.status_code == 413
        assert reply.json()["error"]["type"] == "too_many_pairs"
        assert "max_queue=3" in reply.json()["error"]["message"]

        async def go():
            async with httpx.AsyncClient(timeout=60) as http:
                first = asyncio.ensure_future(
                    http.post(f"{handle.url}/score", json=body(PAIRS[:2]))
                )
                while batcher.pending < 2:  # the first request is queued, waiting for a batch
                    await asyncio.sleep(0.01)
                full = await http.post(f"{handle.url}/score", json=body(PAIRS[2:4]))
                last = await http.post(f"{handle.url}/score", json=body(PAIRS[4:5]))  # fills it
                return full, await first, last

        full, first, last = asyncio.run(go())
        assert full.status_code == 503 and full.json()["error"]["type"] == "overloaded"
        assert "max_queue=3" in full.json()["error"]["message"]
        assert first.status_code == 200 and len(first.json()["scores"]) == 2
        assert last.status_code == 200 and len(last.json()["scores"]) == 1
    finally:
        handle.stop()


def test_reward_http_and_in_process(rm_dir, expected):
    inputs = [RewardInput(_task(), p, r) for p, r in PAIRS]
    handle, _ = start_rm_server(rm_dir, max_batch_size=8, max_wait_ms=5)
    try:
        http_reward = RewardModelReward(base_url=handle.url, request_size=4)
        assert isinstance(http_reward, Reward)
        results = asyncio.run(http_reward.score(inputs))
    finally:
        handle.stop()
    local = RewardModelReward(model=str(rm_dir))
    local_results = asyncio.run(local.score(inputs))
    local_again = asyncio.run(local.score(inputs[:2]))  # a new event loop works too
    for pair, a, b in zip(PAIRS, results, local_results, strict=True):
        assert a.error is None and b.error is None
        assert a.score == pytest.approx(expected[pair], rel=1e-5, abs=1e-5)
        assert b.score == pytest.approx(expected[pair], rel=1e-5, abs=1e-5)
        assert a.components == {"reward_model": a.score}
    assert [r.score for r in local_again] == pytest.approx(
        [r.score for r in local_results[:2]], rel=1e-5, abs=1e-5
    )


def test_reward_retries_then_records_error():
    port = free_port()
    reward = RewardModelReward(
        base_url=f"http://127.0.0.1:{port}", max_retries=2, backoff_s=0.01, failure_score=-1.0
    )
    results = asyncio.run(reward.score([RewardInput(_task(), "p", "r")]))
    assert reward.client.attempts == 3
    assert results[0].score == -1.0
    assert "cannot reach" in results[0].error and "3 attempt(s)" in results[0].error


def test_reward_needs_exactly_one_source(rm_dir):
    with pytest.raises(ValueError, match="exactly one"):
        RewardModelReward()
    with pytest.raises(ValueError, match="exactly one"):
        RewardModelReward(base_url="http://x", model=str(rm_dir))


def test_cli_serve_rm(rm_dir, tmp_path, capsys):
    import subprocess
    import sys

    from temper.cli.main import main as cli_main

    assert cli_main(["serve-rm", str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err

    port = free_port()
    cmd = [sys.executable, "-m", "temper.cli.main", "serve-rm", str(rm_dir), "--port", str(port)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        # The URL line comes once the port accepts connections: connect at once, no retry.
        for line in proc.stdout:  # uvicorn's log lines (stderr) come here too
            if line.startswith("temper serve-rm:"):
                break
        assert f"at http://127.0.0.1:{port}/score" in line, line
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
        reply = httpx.post(
            f"http://127.0.0.1:{port}/score",
            json={"pairs": [{"prompt": "a", "response": "b"}]},
            timeout=30,
        )
        assert reply.status_code == 200 and len(reply.json()["scores"]) == 1
    finally:
        proc.terminate()
        proc.wait(20)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"not json", "body: not valid JSON"),
        (b"[1]", "body: expected a JSON object"),
        (b"{}", "pairs: Field required"),
        (b'{"pairs": {}}', "pairs: Input should be a valid list"),
        (b'{"pairs": [], "x": 1}', "x: Extra inputs are not permitted"),
        (b'{"pairs": [3]}', "pairs.0: Input should be an object"),
        (b'{"pairs": [{"prompt": "p", "response": 1}]}', "pairs.0.response: Input should be a"),
        (b'{"pairs": [{"prompt": "p", "response": "r", "k": 0}]}', "pairs.0.k: Extra inputs"),
    ],
)
def test_parse_score_request_names_the_bad_field(body, message):
    with pytest.raises(ValueError) as info:
        parse_score_request(body)
    assert str(info.value).startswith(message)
    assert "\n" not in str(info.value)


def test_parse_score_request_keeps_order():
    body = b'{"pairs": [{"prompt": "a", "response": "b"}, {"response": "d", "prompt": "c"}]}'
    assert parse_score_request(body) == [("a", "b"), ("c", "d")]


def test_length_groups_split_only_where_padding_costs_more_than_a_forward():
    assert length_groups([]) == []
    assert length_groups([30] * 64) == [64]  # equal lengths: one forward
    # 10 rows of 20 then one of 100: padding 10 * 80 = 800 tokens > 64, so cut.
    assert length_groups([20] * 10 + [100]) == [10, 11]
    # 3 rows of 20 then 40: 3 * 20 = 60 <= 64, so it joins.
    assert length_groups([20, 20, 20, 40]) == [4]
    assert length_groups([20, 20, 20, 40], split_cost=10) == [3, 4]


def test_score_pairs_groups_give_the_same_scores_as_one_at_a_time(loaded, expected):
    model, tok = loaded
    long_pair = ("a long prompt " * 20, "and a long response " * 10)
    pairs = [*PAIRS, long_pair, PAIRS[0]]
    single = compute.run(score_pairs, model, tok, [long_pair])[0]
    got = compute.run(score_pairs, model, tok, pairs)
    assert got == pytest.approx(
        [expected[p] for p in PAIRS] + [single, expected[PAIRS[0]]], rel=1e-5, abs=1e-5
    )
