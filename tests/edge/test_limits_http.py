"""Limits as clients see them: 429 with Retry-After, the token-budget marker, 503 when fail-closed,
and keep-alive comments while a request waits for a replica."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import httpx
from structlog.testing import capture_logs

from floodgate_client.decoder import ChunkDecoder, stream_error
from floodgate_client.errors import FloodgateError, ServiceUnavailableError, StreamError
from floodgate_client.retry import retryable
from floodgate_client.sse import ServerSentEvent
from tests.edge.conftest import ROOMY_TIERS
from tests.edge.sse_client import CHAT, DONE, KEEPALIVE, LONG_PROMPT, LONG_TOKENS, MODEL, content_of, events
from tests.support.held_engines import engines_held
from tests.support.live_server import start_server
from tests.support.ports import free_port
from tests.support.redis_server import start_redis

SHORT: dict[str, Any] = {"model": MODEL, "messages": LONG_PROMPT, "max_tokens": 2}


def _paid(**changes: Any) -> dict[str, Any]:
    return {"tiers": {"paid": ROOMY_TIERS["paid"] | changes}}


def test_request_limit_answers_429_with_retry_after(tmp_path: Path) -> None:
    with start_server(tmp_path, _paid(requests_per_window=2, request_window_s=3600)) as server:
        with httpx.Client(base_url=server.base_url) as client:
            for _ in range(2):
                ok = client.post(CHAT, json=SHORT, headers=server.auth("paid"))
                assert ok.status_code == 200
            assert ok.headers["x-ratelimit-remaining-requests"] == "0"
            denied = client.post(CHAT, json=SHORT, headers=server.auth("paid"))
    assert denied.status_code == 429
    error = denied.json()["error"]
    assert error["type"] == "requests" and error["code"] == "rate_limit_exceeded"  # OpenAI's shape
    retry_ms = int(denied.headers["retry-after-ms"])
    assert 0 < retry_ms <= 3600 * 1000
    assert int(denied.headers["retry-after"]) == math.ceil(retry_ms / 1000)
    assert denied.headers["x-ratelimit-limit-requests"] == "2"


def test_a_429_names_its_request_id_and_the_log_has_it(tmp_path: Path) -> None:
    # The client's errors carry the id "for support and logs": a refusal's must be findable.
    with start_server(tmp_path, _paid(requests_per_window=1, request_window_s=3600)) as server:
        with httpx.Client(base_url=server.base_url) as client, capture_logs() as logs:
            ok = client.post(CHAT, json=SHORT, headers=server.auth("paid"))
            denied = client.post(CHAT, json=SHORT, headers=server.auth("paid"))
    assert ok.status_code == 200 and denied.status_code == 429
    request_id = denied.headers["x-request-id"]
    assert request_id.startswith("chatcmpl-") and request_id != ok.headers["x-request-id"]
    refused = [line for line in logs if line["event"] == "chat_refused"]
    assert [(line["request_id"], line["status"], line["code"]) for line in refused] == [
        (request_id, 429, "rate_limit_exceeded")
    ]


def test_a_prompt_larger_than_the_whole_token_budget_is_a_400_that_costs_no_request(tmp_path: Path) -> None:
    overrides = _paid(tokens_per_window=40, requests_per_window=5, request_window_s=3600)
    huge = {"model": MODEL, "messages": [{"role": "user", "content": "word " * 60}], "max_tokens": 1}
    with start_server(tmp_path, overrides) as server, httpx.Client(base_url=server.base_url) as client:
        refused = client.post(CHAT, json=huge, headers=server.auth("paid"))
        # Too long for the model's context as well: that is what the client can act on.
        beyond = huge | {"messages": [{"role": "user", "content": "word " * 5000}]}
        too_long = client.post(CHAT, json=beyond, headers=server.auth("paid"))
        ok = client.post(CHAT, json=SHORT | {"max_tokens": 1}, headers=server.auth("paid"))
    assert too_long.status_code == 400
    assert too_long.json()["error"]["code"] == "context_length_exceeded"
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == "messages" and error["code"] == "tokens_exceed_budget"
    assert "40 tokens per 3600s" in error["message"]
    # The limiter was never asked: the next request is the first one it counts.
    assert ok.status_code == 200 and ok.headers["x-ratelimit-remaining-requests"] == "4"


def test_a_prompt_as_large_as_the_whole_token_budget_is_a_400_not_an_empty_reply(tmp_path: Path) -> None:
    # Admitted, it would spend the whole budget on a reply of no tokens (200, content "").
    with (
        start_server(tmp_path / "roomy", _paid()) as server,
        httpx.Client(base_url=server.base_url) as client,
    ):
        prompt_tokens = client.post(CHAT, json=SHORT, headers=server.auth("paid")).json()["usage"][
            "prompt_tokens"
        ]
    with start_server(tmp_path / "exact", _paid(tokens_per_window=prompt_tokens)) as server:
        with httpx.Client(base_url=server.base_url) as client:
            exact = client.post(CHAT, json=SHORT, headers=server.auth("paid"))
    assert exact.status_code == 400, exact.text
    assert exact.json()["error"]["code"] == "tokens_exceed_budget"
    assert f"{prompt_tokens} tokens" in exact.json()["error"]["message"]


def test_a_prompt_larger_than_one_edges_share_of_the_budget_is_a_400(tmp_path: Path) -> None:
    """Each of two edges with the in-process limiter enforces half of every tier. A prompt the tier
    holds but the half does not was admitted (charged the whole half) and answered 200 with no
    text, finish_reason "length" and the budget's marker, on every edge and every day: no wait
    could ever give it a reply there."""
    longer = SHORT | {"messages": [{"role": "user", "content": "hi " * 6}]}
    with (
        start_server(tmp_path / "roomy", _paid()) as server,
        httpx.Client(base_url=server.base_url) as client,
    ):
        short_tokens, long_tokens = (
            client.post(CHAT, json=body, headers=server.auth("paid")).json()["usage"]["prompt_tokens"]
            for body in (SHORT, longer)
        )
    budget = 2 * short_tokens + 10  # its half holds the short prompt and a reply, not the longer one
    assert budget // 2 <= long_tokens <= budget - 1
    overrides = _paid(tokens_per_window=budget, token_window_s=3600) | {"limiter": {"instance_count": 2}}
    with start_server(tmp_path / "halves", overrides) as server:
        with httpx.Client(base_url=server.base_url) as client:
            refused = client.post(CHAT, json=longer, headers=server.auth("paid"))
            ok = client.post(CHAT, json=SHORT, headers=server.auth("paid"))
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["code"] == "tokens_exceed_budget" and error["param"] == "messages"
    assert f"({budget // 2} of {budget} tokens per 3600s)" in error["message"], error["message"]
    # The limiter was never asked: the next request is the first one it counts.
    assert ok.status_code == 200, ok.text
    assert ok.headers["x-ratelimit-remaining-requests"] == str(
        ROOMY_TIERS["paid"]["requests_per_window"] // 2 - 1
    )


def test_token_budget_running_out_stops_with_a_marker(tmp_path: Path, long_body: dict[str, Any]) -> None:
    budget = 80
    with start_server(tmp_path, _paid(tokens_per_window=budget, token_window_s=86400)) as server:
        body = long_body | {"stream_options": {"include_usage": True}}
        with httpx.Client(base_url=server.base_url) as client:
            with client.stream("POST", CHAT, json=body, headers=server.auth("paid")) as response:
                assert response.status_code == 200
                got = list(events(response))
    assert got[-1] == DONE
    usage, final = got[-2]["usage"], got[-3]
    assert final["choices"][0]["finish_reason"] == "length"
    assert final["floodgate"] == {"limit_reached": "tokens"}
    assert usage["completion_tokens"] < LONG_TOKENS
    # Input and output together stay within the budget (a hair of refill aside).
    assert usage["total_tokens"] <= budget + 1


def test_redis_down_fail_closed_tier_and_remote_cancel_answer_503(tmp_path: Path) -> None:
    overrides = _paid(on_store_failure="closed") | {
        "limiter": {"backend": "redis", "redis_url": f"redis://127.0.0.1:{free_port()}/0", "timeout_ms": 200}
    }
    with start_server(tmp_path, overrides) as server:
        response = httpx.post(server.base_url + CHAT, json=SHORT, headers=server.auth("paid"))
        # Nor can a cancel be routed to another instance through the same Redis.
        cancel = httpx.post(f"{server.base_url}{CHAT}/chatcmpl-elsewhere/cancel", headers=server.auth("paid"))
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "limiter_unavailable"
    assert int(response.headers["retry-after"]) >= 1
    assert cancel.status_code == 503
    assert cancel.json()["error"]["code"] == "cancel_unavailable"


def _raised_by_the_client(got: list[Any]) -> tuple[FloodgateError, ChunkDecoder]:
    """What the client raises reading these events (the stream's JSON events and [DONE]), with the
    decoder that read them: it alone knows whether text came before the error."""
    decoder = ChunkDecoder()
    for payload in got:
        if isinstance(payload, str) and payload.startswith(":"):
            continue  # a keep-alive comment, which the client's parser drops
        data = payload if payload == DONE else json.dumps(payload)
        try:
            decoder.feed(ServerSentEvent(data))
        except FloodgateError as error:
            return error, decoder
    raise AssertionError(f"no error event in {got[-3:]}")


def test_redis_lost_mid_stream_on_a_fail_closed_tier_ends_it_with_a_stream_error_not_the_budgets_marker(
    tmp_path: Path,
) -> None:
    """Nothing vouches for more of the user's tokens once the store is gone: the stream stops. It
    ended as a spent budget ("limit_reached": "tokens", finish_reason length, a review), which a
    client waits out for a refill of a budget it still had; it is the store's failure. Text had come,
    so the client raises it as a StreamError without a status (d7a628e), never sent again: this test
    built its expected error as if no text had, and checked for the 503 that event is before text."""
    redis = start_redis()
    overrides = _paid(on_store_failure="closed") | {
        "limiter": {"backend": "redis", "redis_url": redis.url, "timeout_ms": 200}
    }
    body = {
        "model": MODEL,
        "messages": LONG_PROMPT,
        "max_tokens": LONG_TOKENS,
        "ignore_eos": True,  # only the store's loss can end it early
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    try:
        with (
            start_server(tmp_path, overrides) as server,
            httpx.Client(base_url=server.base_url, timeout=60) as client,
        ):
            # Held still from before the request, so no token is charged until Redis is gone.
            with (
                engines_held(server) as let_go,
                client.stream("POST", CHAT, json=body, headers=server.auth("paid")) as response,
            ):
                assert response.status_code == 200
                stream = events(response)
                first = [next(stream)]  # the first event: admitted on Redis
                redis.kill()
                let_go()
                got = first + list(stream)
    finally:
        redis.stop()
    assert got[-1] == DONE
    error = got[-2]["error"]
    assert error["code"] == "limiter_unavailable", got[-3:]
    # As the client reads the stream: text came first, so the store's loss cut a reply under way.
    raised, decoder = _raised_by_the_client(got)
    assert decoder.saw_text and content_of(got), got[:3]
    assert type(raised) is StreamError and raised.status_code is None, raised
    assert raised.code == "limiter_unavailable" and not retryable(raised)
    # With its wait, which an error event can only say in its object or message (no Retry-After).
    assert raised.retry_after_s is not None and raised.retry_after_s > 0
    # The same event before any text would be the 503 a new request gets, to retry.
    refusal = stream_error(got[-2], "r", saw_text=False)
    assert isinstance(refusal, ServiceUnavailableError) and refusal.status_code == 503
    assert refusal.retry_after_s == raised.retry_after_s
    usage = got[-3]["usage"]
    assert 0 < usage["completion_tokens"] < LONG_TOKENS  # its first lease's tokens came, and were charged
    assert not any(isinstance(e, dict) and e.get("floodgate") for e in got)


def test_queued_requests_get_keepalives_429_when_full_and_can_be_cancelled(
    tmp_path: Path, long_body: dict[str, Any]
) -> None:
    # One sequence per replica: while the first request runs, the others wait in the queue.
    overrides = {
        "engine": {"max_num_seqs": 1},
        "server": {"keepalive_s": 0.02},
        "admission": {"max_queue": 1},
        **_paid(),
    }
    with (
        start_server(tmp_path, overrides) as server,
        httpx.Client(base_url=server.base_url, timeout=30) as client,
    ):
        paid = server.auth("paid")
        with client.stream("POST", CHAT, json=long_body, headers=paid) as first:
            first_events = events(first)
            first_id = next(first_events)["request_id"]
            next(first_events)  # it holds the only slot now

            with_usage = SHORT | {"stream": True, "stream_options": {"include_usage": True}}
            with client.stream("POST", CHAT, json=with_usage, headers=paid) as second:
                waiting = events(second)
                second_id = next(waiting)["request_id"]
                assert next(waiting) == KEEPALIVE
                # The queue (max_queue=1) is full: a third request is turned away up front.
                third = client.post(CHAT, json=SHORT, headers=paid)
                assert third.status_code == 429
                assert third.json()["error"]["code"] == "queue_full"
                assert int(third.headers["retry-after"]) >= 1 and "retry-after-ms" in third.headers
                # Cancelled while still queued: it ends at once, without a token.
                assert client.post(f"{CHAT}/{second_id}/cancel", headers=paid).status_code == 200
                second_rest = [e for e in waiting if e != KEEPALIVE]

            with client.stream("POST", CHAT, json=SHORT | {"stream": True}, headers=paid) as fourth:
                queued = events(fourth)
                next(queued)
                assert next(queued) == KEEPALIVE
                assert client.post(f"{CHAT}/{first_id}/cancel", headers=paid).status_code == 200
                fourth_rest = [e for e in queued if e != KEEPALIVE]
            list(first_events)

    assert second_rest[-1] == DONE
    assert second_rest[-3]["floodgate"] == {"cancelled": True}
    # It cost nothing, and its usage says so (it said its prompt's tokens, which nobody charged).
    assert second_rest[-2]["usage"] == {
        "prompt_tokens": 0,
        "completion_tokens": 0,
        "total_tokens": 0,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    assert len(second_rest) == 3
    assert fourth_rest[-1] == DONE
    assert fourth_rest[-2]["choices"][0]["finish_reason"] in ("stop", "length")
    assert "floodgate" not in fourth_rest[-2]


def test_waiting_out_a_token_429s_retry_after_gets_the_whole_reply(
    tmp_path: Path, long_body: dict[str, Any]
) -> None:
    # Told only when its prompt and a first lease of output fit, a client that waited was admitted
    # and its reply cut by the budget a few tokens in, its prompt charged again on every retry (a
    # review: 636 output tokens for 5,025 prompt tokens in 37 s through the OpenAI SDK).
    budget, reply = 200, 60
    tier = _paid(tokens_per_window=budget, token_window_s=4, requests_per_window=100, request_window_s=3600)
    ask = long_body | {"stream": False, "max_tokens": reply}
    with start_server(tmp_path, tier) as server, httpx.Client(base_url=server.base_url) as client:
        prompt = client.post(CHAT, json=ask | {"max_tokens": 1}, headers=server.auth("paid")).json()
        spend = budget - 2 * prompt["usage"]["prompt_tokens"] - 1
        client.post(CHAT, json=ask | {"max_tokens": spend}, headers=server.auth("paid"))
        refused = client.post(CHAT, json=ask, headers=server.auth("paid"))
        assert refused.status_code == 429, refused.text
        time.sleep(int(refused.headers["retry-after-ms"]) / 1000)  # what a client does with it
        waited = client.post(CHAT, json=ask, headers=server.auth("paid"))
    assert waited.status_code == 200, waited.text
    answer = waited.json()
    assert answer["usage"]["completion_tokens"] == reply, answer
    assert "floodgate" not in answer or "limit_reached" not in answer["floodgate"], answer
