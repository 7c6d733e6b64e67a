"""The streaming and non-streaming answers of a real edge, as a plain HTTP client sees them, on the
in-process engine and on Triton alike; and the same seeded request streams the same answer on both."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from edge.text.model_text import ModelText
from tests.edge.conftest import BOTH_PATHS, idle_engine, replica_names
from tests.edge.sse_client import CHAT, DONE, LONG_PROMPT, MODEL, content_of, events
from tests.support.live_server import LiveServer

UPSTREAMS = BOTH_PATHS

RATE_HEADERS = (
    "x-ratelimit-limit-requests",
    "x-ratelimit-remaining-requests",
    "x-ratelimit-reset-requests",
    "x-ratelimit-limit-tokens",
    "x-ratelimit-remaining-tokens",
    "x-ratelimit-reset-tokens",
)


def _prompt_tokens(server: LiveServer, messages: list[dict[str, str]]) -> int:
    return len(ModelText.load(Path(server.settings.model.demo_dir)).encode_chat(messages))


def test_stream_follows_the_contract(server: LiveServer, client: httpx.Client) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello 👋 你好"}]
    body = {
        "model": MODEL,
        "messages": messages,
        "stream": True,
        "max_tokens": 12,
        "seed": 1,
        "stream_options": {"include_usage": True},
    }
    with client.stream("POST", CHAT, json=body, headers=server.auth("paid")) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["cache-control"] == "no-cache"
        assert response.headers["x-accel-buffering"] == "no"
        for name in RATE_HEADERS:
            assert name in response.headers
        got = list(events(response))

    rid = response.headers["x-request-id"]
    assert re.fullmatch(r"chatcmpl-[0-9a-f]{24}", rid)
    first = got[0]
    assert first["request_id"] == rid and first["id"] == rid
    assert first["object"] == "chat.completion.chunk"
    assert first["choices"] == [
        {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
    ]
    assert got[-1] == DONE
    chunks = [e for e in got[1:-1] if isinstance(e, dict)]
    assert all(c["id"] == rid and c["model"] == MODEL for c in chunks)
    usage_chunk, final = chunks[-1], chunks[-2]
    assert usage_chunk["choices"] == []
    assert final["choices"][0]["delta"] == {}
    assert final["choices"][0]["finish_reason"] in ("stop", "length")
    usage = usage_chunk["usage"]
    assert usage["prompt_tokens"] == _prompt_tokens(server, messages)
    assert 1 <= usage["completion_tokens"] <= 12
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    if final["choices"][0]["finish_reason"] == "length":
        assert usage["completion_tokens"] == 12
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-2])


def test_stream_without_include_usage_has_no_usage_chunk(
    server: LiveServer, client: httpx.Client, long_body: dict[str, Any]
) -> None:
    body = long_body | {"max_tokens": 5}
    with client.stream("POST", CHAT, json=body, headers=server.auth("free")) as response:
        got = list(events(response))
    assert got[-1] == DONE
    final = got[-2]
    assert final["choices"][0]["finish_reason"] == "length"
    assert not any(isinstance(e, dict) and "usage" in e for e in got)


def test_null_stream_and_include_usage_read_as_false(server: LiveServer, client: httpx.Client) -> None:
    """OpenAI's spec (and vLLM) take null for both; clients that fill every field send it."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    answer = client.post(CHAT, json=body | {"stream": None}, headers=server.auth("paid"))
    assert answer.status_code == 200, answer.text
    assert answer.json()["object"] == "chat.completion"
    streamed = body | {"stream": True, "stream_options": {"include_usage": None}}
    with client.stream("POST", CHAT, json=streamed, headers=server.auth("paid")) as response:
        assert response.status_code == 200
        got = list(events(response))
    assert got[-1] == DONE and not any(isinstance(e, dict) and "usage" in e for e in got)


def test_non_stream_answer_matches_the_stream(server: LiveServer, client: httpx.Client) -> None:
    # Greedy decoding is deterministic: both modes must produce the same text and counts.
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Tell me a story"}], "max_tokens": 40}
    body["temperature"] = 0
    answer = client.post(CHAT, json=body, headers=server.auth("paid"))
    assert answer.status_code == 200
    data = answer.json()
    assert data["object"] == "chat.completion"
    assert data["id"] == answer.headers["x-request-id"]
    for name in RATE_HEADERS:
        assert name in answer.headers
    with client.stream(
        "POST",
        CHAT,
        json=body | {"stream": True, "stream_options": {"include_usage": True}},
        headers=server.auth("paid"),
    ) as response:
        got = list(events(response))
    assert data["choices"][0]["message"]["content"] == content_of(got)
    # The counts; the second request may find the first's prompt in the prefix cache.
    assert _counts(data["usage"]) == _counts(got[-2]["usage"])
    assert data["choices"][0]["finish_reason"] == got[-3]["choices"][0]["finish_reason"]


def test_stop_string_cuts_the_text_before_it(server: LiveServer, client: httpx.Client) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Tell me a story"}], "temperature": 0}
    full = client.post(CHAT, json=body | {"max_tokens": 60}, headers=server.auth("paid")).json()
    text = full["choices"][0]["message"]["content"]
    # A stop string from the middle of the greedy answer, spanning several tokens, not seen earlier.
    cut = next(i for i in range(20, len(text) - 6) if text.find(text[i : i + 6]) == i)
    stop = text[cut : cut + 6]
    with client.stream(
        "POST",
        CHAT,
        json=body | {"max_tokens": 60, "stream": True, "stop": ["@@never@@", stop]},
        headers=server.auth("paid"),
    ) as response:
        got = list(events(response))
    assert content_of(got) == text[:cut]
    assert got[-2]["choices"][0]["finish_reason"] == "stop"


def test_models_lists_the_served_model(server: LiveServer, client: httpx.Client) -> None:
    data = client.get("/v1/models", headers=server.auth("free")).json()
    assert [m["id"] for m in data["data"]] == [MODEL]


def test_playground_page_is_served(client: httpx.Client) -> None:
    page = client.get("/")
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    assert "/v1/chat/completions" in page.text


def test_health_ready_and_metrics(server: LiveServer, client: httpx.Client) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    ready = httpx.get(server.ops_url + "/readyz", timeout=30)  # the detail: operator listener only
    names = replica_names(server)
    assert ready.status_code == 200 and ready.json()["replicas"] == dict.fromkeys(names, True)
    answer = client.post(
        CHAT, json={"model": MODEL, "messages": LONG_PROMPT, "max_tokens": 3}, headers=server.auth("free")
    )
    assert answer.status_code == 200, answer.text
    # Sampled at the demo model's temperature 1.0, the reply may end on its own within 3 tokens.
    reason = answer.json()["choices"][0]["finish_reason"]
    assert client.get("/metrics").status_code == 404  # operator endpoints: not on the public port
    text = server.metrics_text()
    for family in (
        "floodgate_time_to_first_token_seconds_bucket",
        # Per model, as TTFT (the single model's label is empty).
        'floodgate_inter_token_latency_seconds_count{model=""}',
        "floodgate_prompt_tokens_total",
        "floodgate_generation_tokens_total",
        f'floodgate_requests_finished_total{{model="",reason="{reason}",tier="free"}}',
        *(f'floodgate_replica_kv_tokens{{model="",replica="{name}"}}' for name in names),
    ):
        assert family in text
    # `_total` is the counters' suffix (Prometheus's naming rules; promtool check metrics flags a
    # gauge with it): a gauge so named read as a counter to whoever applied rate() to it.
    gauges = [f.name for f in text_string_to_metric_families(text) if f.type == "gauge"]
    assert [name for name in gauges if name.endswith("_total")] == []


def test_health_and_readiness_answer_head(client: httpx.Client) -> None:
    """A probe by HEAD gets GET's status and no body, and the connection stays usable after it."""
    for path in ("/healthz", "/readyz"):
        head = client.head(path)
        assert (head.status_code, head.content) == (200, b"")
    assert client.get("/healthz").json() == {"status": "ok"}  # the same connection, nothing left over


def _counts(usage: dict[str, Any]) -> dict[str, int]:
    """The usage's token counts, without what the replica found in its prefix cache (a repeated
    prompt finds more; Triton reports none)."""
    return {k: v for k, v in usage.items() if k != "prompt_tokens_details"}


def _streamed_answer(server: LiveServer, body: dict[str, Any]) -> tuple[str, str, dict[str, int]]:
    """The reply to `body` on a replica running nothing else. Replies are compared across requests
    here, and a sequence an earlier test left to be aborted would share the request's steps: the
    batch's rows change the float sums, which flip the demo model's near-ties (under load a greedy
    and a top_k 1 reply once differed so in two tokens)."""
    idle_engine(server)
    with httpx.Client(base_url=server.base_url, timeout=30.0) as client:
        with client.stream("POST", CHAT, json=body, headers=server.auth("paid")) as response:
            assert response.status_code == 200, response.read()
            got = list(events(response))
    assert got[-1] == DONE
    return content_of(got), got[-3]["choices"][0]["finish_reason"], _counts(got[-2]["usage"])


RIVERS: dict[str, Any] = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "Tell me about rivers."}],
    "stream": True,
    "max_tokens": 48,
    "stream_options": {"include_usage": True},
}


@pytest.mark.parametrize("temperature", [0.0, 0.8], ids=["greedy", "sampled"])
def test_a_seeded_request_streams_the_same_answer_on_both_paths(
    local_server: LiveServer, triton_server: LiveServer, temperature: float
) -> None:
    body = RIVERS | {"temperature": temperature, "seed": 5}
    on_engine = _streamed_answer(local_server, body)
    on_triton = _streamed_answer(triton_server, body)
    text, _, usage = on_engine
    assert text and usage["completion_tokens"] > 1
    assert on_triton == on_engine


def test_presence_and_frequency_penalties_reach_the_replica_on_both_paths(
    local_server: LiveServer, triton_server: LiveServer
) -> None:
    body = RIVERS | {"temperature": 0.0}
    penalised = body | {"presence_penalty": 1.5, "frequency_penalty": 1.0}
    # Each path against its own greedy reply, as logit_bias below: greedy, so only the penalties
    # can have changed it (the Triton path carries them as TensorRT-LLM's inputs). Compared across
    # the paths, the demo model's near-ties could flip one token and fail a correct path.
    for server in (local_server, triton_server):
        assert _streamed_answer(server, penalised)[0] != _streamed_answer(server, body)[0]


def test_top_k_reaches_the_replica_on_both_paths(local_server: LiveServer, triton_server: LiveServer) -> None:
    sampled = RIVERS | {"temperature": 1.5, "seed": 11}
    for server in (local_server, triton_server):
        # Each path against its own greedy reply: the demo model's random weights leave near-ties
        # that two engines computing the prompt in different chunks may break differently.
        greedy = _streamed_answer(server, RIVERS | {"temperature": 0.0})
        assert _streamed_answer(server, sampled)[0] != greedy[0]  # sampling alone changes it
        # top_k 1 leaves one token to draw from at every step: the greedy reply.
        assert _streamed_answer(server, sampled | {"top_k": 1}) == greedy


def test_repetition_penalty_reaches_the_replica_on_both_paths(
    local_server: LiveServer, triton_server: LiveServer
) -> None:
    body = RIVERS | {"temperature": 0.0}
    penalised = body | {"repetition_penalty": 1.8}
    # Each path against its own greedy reply (TensorRT-LLM's input of that name on Triton's).
    for server in (local_server, triton_server):
        assert _streamed_answer(server, penalised)[0] != _streamed_answer(server, body)[0]


def test_logit_bias_reaches_the_replica_on_both_paths(
    local_server: LiveServer, triton_server: LiveServer
) -> None:
    """Each path against its own greedy reply: the demo model's random weights leave near-ties that
    two engines, their prefix caches holding different prompts, may break differently (a banned
    reply once differed between the paths in two swapped tokens 40 in)."""
    body = RIVERS | {"temperature": 0.0}
    tokenizer = ModelText.load(Path(local_server.settings.model.demo_dir)).tokenizer
    for server in (local_server, triton_server):
        # Banned: every token that spells the greedy reply's first one, so it must start otherwise.
        first = _streamed_answer(server, body | {"max_tokens": 1})[0]
        spelling_it = [i for i in range(tokenizer.get_vocab_size()) if tokenizer.decode([i]) == first]
        assert spelling_it
        banned = body | {"logit_bias": {str(i): -100 for i in spelling_it}}
        # The Triton path carries it as TensorRT-LLM's embedding_bias row.
        assert _streamed_answer(server, banned | {"max_tokens": 1})[0] != first
        # Forced: +100 on "a", which greedy then picks at every step.
        forced = body | {"logit_bias": {str(tokenizer.token_to_id("a")): 100}}
        assert _streamed_answer(server, forced)[:2] == ("a" * 48, "length")


# The demo model's greedy reply to it ends early, on its end token (the Triton path's end_id).
HI: dict[str, Any] = RIVERS | {"messages": [{"role": "user", "content": "Hi"}], "temperature": 0.0}


def test_min_tokens_holds_the_end_back_on_both_paths(
    local_server: LiveServer, triton_server: LiveServer
) -> None:
    text, reason, usage = _streamed_answer(local_server, HI)
    assert reason == "stop" and usage["completion_tokens"] < 30
    held = HI | {"min_tokens": 30}
    on_engine = _streamed_answer(local_server, held)
    assert on_engine[2]["completion_tokens"] >= 30
    assert on_engine[0].startswith(text) and len(on_engine[0]) > len(text)  # greedy: the same start
    assert _streamed_answer(triton_server, held) == on_engine  # TensorRT-LLM's min_length


def test_ignore_eos_runs_to_max_tokens_on_both_paths(
    local_server: LiveServer, triton_server: LiveServer
) -> None:
    text, reason, _ = _streamed_answer(local_server, HI)
    assert reason == "stop"
    for server in (local_server, triton_server):
        past, reason, usage = _streamed_answer(server, HI | {"ignore_eos": True})
        assert (reason, usage["completion_tokens"]) == ("length", 48), server.base_url
        assert past.startswith(text) and len(past) > len(text), server.base_url
    # A stop string still ends it.
    stop = next(word for word in text.split() if word.isalpha() and len(word) > 2)
    stopped = _streamed_answer(local_server, HI | {"ignore_eos": True, "stop": [stop]})
    assert stopped[:2] == (text[: text.index(stop)], "stop")


def test_a_stop_string_before_min_tokens_is_sent_on_both_paths(
    local_server: LiveServer, triton_server: LiveServer
) -> None:
    """As vLLM's min_tokens, the stop strings wait for it too (edge/text/stops.py): the edge
    matches them on both paths."""
    long = HI | {"ignore_eos": True}
    text, _, _ = _streamed_answer(local_server, long)
    stop = next(word for word in text.split() if word.isalpha() and len(word) > 2)
    end = text.index(stop) + len(stop)
    assert _streamed_answer(local_server, long | {"stop": [stop]})[:2] == (text[: text.index(stop)], "stop")
    held = long | {"stop": [stop], "min_tokens": 48}
    on_engine = _streamed_answer(local_server, held)
    assert on_engine[0].startswith(text[:end])  # the stop string went out as text
    assert on_engine[2]["completion_tokens"] == 48
    assert _streamed_answer(triton_server, held) == on_engine


def _greedy_reply_cut(server: LiveServer, count: int) -> list[str]:
    """The greedy RIVERS reply's text cut after 0, 1, ... `count` tokens (one request a length)."""
    cuts = [
        _streamed_answer(server, RIVERS | {"temperature": 0.0, "max_tokens": n})[0]
        for n in range(1, count + 1)
    ]
    return ["", *cuts]


def test_stop_token_ids_end_the_reply_there_on_both_paths(
    local_server: LiveServer, triton_server: LiveServer
) -> None:
    tokenizer = ModelText.load(Path(local_server.settings.model.demo_dir)).tokenizer
    cut = _greedy_reply_cut(local_server, 12)
    # A token past the first whose text is whole, follows the text before it and is new to the
    # reply (no token before it spells it): each token id that spells it stops the reply there.
    at = next(
        i
        for i in range(2, len(cut) - 1)
        if cut[i + 1].startswith(cut[i])
        and (piece := cut[i + 1][len(cut[i]) :]).isprintable()
        and "\ufffd" not in piece
        and piece not in cut[i]
    )
    piece = cut[at + 1][len(cut[at]) :]
    spelling_it = [i for i in range(tokenizer.get_vocab_size()) if tokenizer.decode([i]) == piece]
    assert spelling_it
    body = RIVERS | {"temperature": 0.0, "stop_token_ids": spelling_it}
    for server in (local_server, triton_server):
        text, reason, usage = _streamed_answer(server, body)
        # Counted as generated, as vLLM counts it; its text left out, as vLLM leaves it out.
        assert (reason, usage["completion_tokens"]) == ("stop", at + 1), server.base_url
        assert text == cut[at], server.base_url
        # Asked for, as vLLM's include_stop_str_in_output: the token's text ends the reply's.
        kept = _streamed_answer(server, body | {"include_stop_str_in_output": True})
        assert kept == (cut[at + 1], "stop", usage), server.base_url


def test_a_developer_message_is_read_as_the_system_prompt(server: LiveServer, client: httpx.Client) -> None:
    """OpenAI's `developer` role is its newer name for `system`. Rendered as a turn of its own,
    SmolLM2's template also put its default system prompt in front (18 prompt tokens with
    "system", 40 with "developer")."""
    replies = {}
    for role in ("system", "developer"):
        messages = [{"role": role, "content": "Be brief."}, {"role": "user", "content": "Hello"}]
        body = {"model": MODEL, "messages": messages, "max_tokens": 6, "temperature": 0}
        answer = client.post(CHAT, json=body, headers=server.auth("paid"))
        assert answer.status_code == 200, answer.text
        replies[role] = (answer.json()["usage"]["prompt_tokens"], answer.json()["choices"][0]["message"])
    system = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}]
    assert replies["developer"] == replies["system"]
    assert replies["system"][0] == _prompt_tokens(server, system)
