"""A reply cut before its end (the cancel endpoint, a client hanging up, the token budget's stop; the
drain's deadline and a revoked key end it the same way) says only that the user's reply would have
run at least that long: it may raise the user's usual reply length (reply_lengths.py), never lower
it. Learnt as the reply's own length, a cancel 5 tokens in took a usual 40-token reply down to 22,
and a new user's first cut one replaced the 256-token prior with its 5: its next replies were
priced at 5 in the fair queue, the running ones expected to end at once (a refusal's Retry-After),
and the limiter asked to wait for 5 reply tokens. On real servers whose replica gives the reply a
length the test picks (`_lengths`)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
import httpx

from edge.upstreams.base import Delta, GenerationRequest, Upstream
from tests.edge.conftest import ROOMY_TIERS, finished_requests
from tests.edge.sse_client import CHAT, events, wait_until
from tests.faults.test_failed_requests_cost_nothing import SHORT
from tests.support.live_server import LiveServer, start_server
from tests.support.scripted_replicas import scripted_replicas

# A request for STALLS + k tokens (k < 100) gets k tokens, then nothing more (a long reply, running);
# one for ENDS + k gets k, then its end: a reply that is k tokens long.
STALLS, ENDS = 500, 900
PRIOR = 256  # the dispatcher's prior_reply_tokens: a user not seen yet
USER = "paid-user"
ROOMY = {"tiers": ROOMY_TIERS}


async def _lengths(inner: Upstream, req: GenerationRequest) -> AsyncIterator[Delta]:
    base = next((b for b in (STALLS, ENDS) if b < req.max_new_tokens < b + 100), None)
    if base is None:
        async for delta in inner.generate(req):
            yield delta
        return
    # Exactly k tokens from the real engine: no end token may come first.
    fixed = replace(req, max_new_tokens=req.max_new_tokens - base, ignore_eos=True, stop_ids=[])
    async for delta in inner.generate(fixed):
        if delta.finish_reason is None:
            yield delta
        elif base == ENDS:
            yield replace(delta, finish_reason="stop")
        else:
            yield replace(delta, finish_reason=None)
            await anyio.sleep_forever()


_replicas = scripted_replicas(_lengths)


def _usual(server: LiveServer) -> int:
    """What the edge expects the user's next reply to run to, allowed the tier's largest."""
    return int(server.app.state.runtime.pipeline.dispatcher.typical_reply_tokens(USER, 2000))


def _running_with(server: LiveServer, tokens: int) -> bool:
    running = list(server.app.state.runtime.pipeline.dispatcher._running)
    return len(running) == 1 and running[0].generated == tokens


def _cancelled_after(server: LiveServer, client: httpx.Client, tokens: int) -> list[Any]:
    """A stream whose reply would run long, cancelled once `tokens` of it came: its events."""
    body = SHORT | {"max_tokens": STALLS + tokens, "stream": True}
    with client.stream("POST", CHAT, json=body) as streamed:
        got = events(streamed)
        request_id = next(got)["id"]
        wait_until(lambda: _running_with(server, tokens), what=f"{tokens} tokens of the reply")
        cancelled = client.post(f"{CHAT}/{request_id}/cancel")
        assert cancelled.status_code == 200, cancelled.text
        return list(got)


def test_a_reply_cancelled_mid_way_may_raise_its_users_usual_length_never_lower_it(tmp_path: Path) -> None:
    with start_server(tmp_path, ROOMY, _replicas) as server:
        with httpx.Client(base_url=server.base_url, timeout=60.0, headers=server.auth("paid")) as client:
            ended = client.post(CHAT, json=SHORT | {"max_tokens": ENDS + 40})
            assert ended.json()["usage"]["completion_tokens"] == 40, ended.text
            learnt = [_usual(server)]
            for tokens in (5, 80):
                rest = _cancelled_after(server, client, tokens)
                assert rest[-2]["floodgate"] == {"cancelled": True}, rest
                learnt.append(_usual(server))
    assert learnt[:2] == [40, 40]  # cut at 5: it would have run 5 or more, which says nothing
    assert 40 < learnt[2] <= 80  # cut at 80: it would have run 80 or more


def test_a_reply_whose_client_hung_up_mid_way_does_not_lower_its_users_usual_length(tmp_path: Path) -> None:
    with start_server(tmp_path, ROOMY, _replicas) as server:
        # The metrics are the process's: tests before this one in it may have counted hang-ups.
        before = finished_requests(server, "disconnected")
        with httpx.Client(base_url=server.base_url, timeout=60.0, headers=server.auth("paid")) as client:
            with client.stream("POST", CHAT, json=SHORT | {"max_tokens": STALLS + 5, "stream": True}):
                wait_until(lambda: _running_with(server, 5), what="5 tokens of the reply")
        wait_until(
            lambda: finished_requests(server, "disconnected") == before + 1,
            what="the edge to see the hang-up",
        )
        assert _usual(server) == PRIOR


def test_a_reply_the_token_budget_cut_does_not_lower_its_users_usual_length(tmp_path: Path) -> None:
    with start_server(tmp_path, ROOMY, _replicas) as server:
        with httpx.Client(base_url=server.base_url, timeout=60.0, headers=server.auth("paid")) as client:
            prompt_tokens = client.post(CHAT, json=SHORT | {"max_tokens": 1}).json()["usage"]["prompt_tokens"]
    budget = {"tokens_per_window": prompt_tokens + 10, "token_window_s": 86400}
    tiers = {"tiers": {"paid": ROOMY_TIERS["paid"] | budget}}
    with start_server(tmp_path / "budget", tiers, _replicas) as server:
        with httpx.Client(base_url=server.base_url, timeout=60.0, headers=server.auth("paid")) as client:
            cut = client.post(CHAT, json=SHORT | {"max_tokens": ENDS + 60})
        assert cut.status_code == 200, cut.text
        assert cut.json()["floodgate"] == {"limit_reached": "tokens"}
        assert 0 < cut.json()["usage"]["completion_tokens"] < 60
        assert _usual(server) == PRIOR
