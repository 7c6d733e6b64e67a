"""A replica whose stream raises something other than UpstreamError after some tokens (an adapter's
bug, a transport error it does not map: a plain RuntimeError here) ends the request as an
UpstreamError mid-stream does: streamed, the client gets the text it was charged for, the usage
chunk it asked for, the error event and [DONE]; not streamed, a 502 error object alone that costs
nothing. The lease is settled, the slot given back, the usage row written and the request's line
logged with its outcome."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
from structlog.testing import capture_logs

from edge.upstreams.base import Delta, GenerationRequest, Upstream
from tests.edge.sse_client import CHAT, DONE, events
from tests.faults.test_failed_requests_cost_nothing import NO_REFILL, SHORT
from tests.support.live_server import start_server
from tests.support.scripted_replicas import scripted_replicas

BOOM_AFTER_3 = 9  # max_tokens the replica below answers with three tokens, then a RuntimeError
BOOM_AT_ONCE = 8  # and with a RuntimeError before any token
STREAM = {"stream": True, "stream_options": {"include_usage": True}}
# Greedy: three sampled tokens may carry no text yet (a character's first bytes), and a stream that
# fails with no text sent is refunded whole by design (edge/generation.py Outcome.got_text); a
# loaded CI run sampled such a start once. Greedy, the three tokens are the same text every run.
GREEDY = {"temperature": 0}


async def _first_three(inner: Upstream, req: GenerationRequest) -> AsyncIterator[Delta]:
    """The replica's first three tokens, none of them its last."""
    tokens = 0
    async for delta in inner.generate(req):
        delta = replace(delta, token_ids=delta.token_ids[: 3 - tokens], finish_reason=None)
        tokens += len(delta.token_ids)
        yield delta
        if tokens >= 3:
            return


async def _raising(inner: Upstream, req: GenerationRequest) -> AsyncIterator[Delta]:
    if req.max_new_tokens == BOOM_AT_ONCE:
        raise RuntimeError("the replica's adapter broke")
    if req.max_new_tokens != BOOM_AFTER_3:
        async for delta in inner.generate(req):
            yield delta
        return
    async for delta in _first_three(inner, req):
        yield delta
    raise RuntimeError("the replica's adapter broke")


_raising_replicas = scripted_replicas(_raising)


def _remaining(answer: httpx.Response) -> int:
    assert answer.status_code == 200, answer.text
    return int(answer.headers["x-ratelimit-remaining-tokens"])


def test_a_stream_whose_replica_raises_mid_stream_ends_with_usage_error_and_done(tmp_path: Path) -> None:
    failing = SHORT | GREEDY | {"max_tokens": BOOM_AFTER_3}
    with start_server(tmp_path, NO_REFILL, _raising_replicas) as server:
        dispatcher = server.app.state.runtime.pipeline.dispatcher
        with httpx.Client(base_url=server.base_url, timeout=60.0, headers=server.auth("paid")) as client:
            before = client.post(CHAT, json=SHORT)
            with capture_logs() as logs, client.stream("POST", CHAT, json=failing | STREAM) as streamed:
                got: list[Any] = [
                    e for e in events(streamed) if not (isinstance(e, str) and e.startswith(":"))
                ]
            after = client.post(CHAT, json=SHORT)
            usage_rows = client.get("/v1/usage").json()
        running = len(dispatcher._running)
    assert streamed.status_code == 200
    assert got[-1] == DONE, got
    assert got[-2]["error"]["type"] == "api_error", got
    assert got[-2]["error"]["code"] == "upstream_error", got
    usage = got[-3]["usage"]
    prompt = before.json()["usage"]["prompt_tokens"]
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (prompt, 3), got
    # Charged what the usage chunk says: the prompt and the three tokens sent.
    # `after`'s own usage is in its remaining, and its reply (sampled, up to 4 tokens) may be longer
    # or shorter than `before`'s: a CI run's `before` stopped at 1 token and `after` ran to 4.
    assert _remaining(before) - _remaining(after) == after.json()["usage"]["total_tokens"] + prompt + 3
    assert running == 0
    line = next(e for e in logs if e["event"] == "chat_completion")
    assert (line["outcome"], line["completion_tokens"]) == ("error", 3), line
    # The server's trouble: a warning, as the same failure refused before admission is (it was an
    # info line, among the successes).
    assert line["log_level"] == "warning", line
    assert any(e["event"] == "upstream_failed" and "RuntimeError" in e["error"] for e in logs), logs
    assert usage_rows, usage_rows


def test_an_answer_not_streamed_whose_replica_raises_after_tokens_is_a_502_that_costs_nothing(
    tmp_path: Path,
) -> None:
    failing = SHORT | {"max_tokens": BOOM_AFTER_3}
    with start_server(tmp_path, NO_REFILL, _raising_replicas) as server:
        with httpx.Client(base_url=server.base_url, timeout=60.0, headers=server.auth("paid")) as client:
            with capture_logs() as logs:
                before = client.post(CHAT, json=SHORT)
                failed = client.post(CHAT, json=failing)
            after = client.post(CHAT, json=SHORT)
    assert failed.status_code == 502, failed.text
    levels = [(e["status"], e["log_level"]) for e in logs if e["event"] == "chat_completion"]
    assert levels == [(200, "info"), (502, "warning")], levels
    assert failed.json()["error"]["code"] == "upstream_error"
    assert _remaining(before) - _remaining(after) == after.json()["usage"]["total_tokens"]


def test_an_answer_whose_replica_raises_before_its_first_token_is_a_502(tmp_path: Path) -> None:
    with start_server(tmp_path, NO_REFILL, _raising_replicas) as server:
        with httpx.Client(base_url=server.base_url, timeout=60.0, headers=server.auth("paid")) as client:
            failed = client.post(CHAT, json=SHORT | {"max_tokens": BOOM_AT_ONCE})
    assert failed.status_code == 502, failed.text
    assert failed.json()["error"]["code"] == "upstream_error"


GARBLED_AFTER_3 = 10  # max_tokens the replica below answers with three tokens, then a garbled delta


async def _garbling(inner: Upstream, req: GenerationRequest) -> AsyncIterator[Delta]:
    """Three tokens, then a delta whose token ids are no ids: the edge's own relay raises at it (a
    TypeError in the detokenizer), the edge's failure rather than one the replica's stream raised."""
    if req.max_new_tokens != GARBLED_AFTER_3:
        async for delta in inner.generate(req):
            yield delta
        return
    async for delta in _first_three(inner, req):
        yield delta
    yield Delta(["garbled"])  # type: ignore[list-item]


_garbling_replicas = scripted_replicas(_garbling)


def test_a_failure_of_the_edges_own_mid_stream_ends_the_stream_settled_and_logged(tmp_path: Path) -> None:
    """An unexpected error in the edge while it relays (a bug, a store's unmapped error) ended the
    stream with an error event, but without the usage chunk the client asked for (the tokens sent
    were charged all the same), and the request's line logged no error; not streamed, a 500
    charged for the tokens the client never saw."""
    failing = SHORT | GREEDY | {"max_tokens": GARBLED_AFTER_3}
    with start_server(tmp_path, NO_REFILL, _garbling_replicas) as server:
        with httpx.Client(base_url=server.base_url, timeout=60.0, headers=server.auth("paid")) as client:
            before = client.post(CHAT, json=SHORT)
            with capture_logs() as logs, client.stream("POST", CHAT, json=failing | STREAM) as streamed:
                got: list[Any] = [
                    e for e in events(streamed) if not (isinstance(e, str) and e.startswith(":"))
                ]
            plain = client.post(CHAT, json=failing)
            after = client.post(CHAT, json=SHORT)
    assert streamed.status_code == 200
    assert got[-1] == DONE, got
    assert got[-2]["error"]["type"] == "api_error", got
    # The three tokens and the garbled one, counted and charged before the relay failed at it.
    usage = got[-3]["usage"]
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (
        before.json()["usage"]["prompt_tokens"],
        4,
    )
    line = next(e for e in logs if e["event"] == "chat_completion")
    assert (line["outcome"], line["completion_tokens"]) == ("error", 4), line
    assert any(e["event"] == "generation_failed" and e["request_id"] == line["request_id"] for e in logs), (
        logs
    )
    assert plain.status_code == 500, plain.text
    assert plain.json()["error"]["type"] == "api_error"
    # Charged the stream what its usage chunk says, nothing for the 500.
    assert (
        _remaining(before) - _remaining(after)
        == after.json()["usage"]["total_tokens"] + usage["total_tokens"]
    )
