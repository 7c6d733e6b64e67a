"""Usage per user adds up to exactly what the limiter charged: streams run to the end, streams
cancelled, streams cut by the token budget, answers without streaming, requests turned away. The
edge is stopped cleanly before the usage store is read: nothing queued may be lost on the way."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import msgspec

from edge.config import TierConfig
from edge.usage.sqlite import SQLiteUsageStore
from limiter import policy
from limiter.memory import MemoryLimiter
from tests.edge.conftest import ROOMY_TIERS, wait_for_engine
from tests.edge.sse_client import _SEED_CANDIDATES, CHAT, DONE, LONG_PROMPT, MODEL, events, find_long_seed
from tests.support.held_engines import engines_held
from tests.support.live_server import LiveServer, start_server

# Token windows so long that nothing refills during the test: the tokens a user's limiter state
# has spent is then exactly capacity - remaining.
NO_REFILL = {"token_window_s": 1e9, "request_window_s": 1e9}
FREE_BUDGET = 100  # tokens: a short request, then a stream the budget stops, then a 429
TIERS = {
    "paid": ROOMY_TIERS["paid"] | NO_REFILL,
    "free": ROOMY_TIERS["free"] | NO_REFILL | {"tokens_per_window": FREE_BUDGET, "max_tokens": 512},
}


def _body(content: str, max_tokens: int, stream: bool = True) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "stream": stream,
    }


def _stream(
    client: httpx.Client, server: LiveServer, who: str, body: dict[str, Any], cancel: bool = False
) -> list[Any]:
    with client.stream("POST", server.base_url + CHAT, json=body, headers=server.auth(who)) as response:
        if response.status_code != 200:
            response.read()
            return [response.status_code]
        got = events(response)
        first = next(got)
        if cancel:
            rid = first["request_id"]
            client.post(f"{server.base_url}{CHAT}/{rid}/cancel", headers=server.auth(who))
        return [first, *got]


def _charged(limiter: MemoryLimiter, user: str, tier: str) -> int:
    """What the limiter holds as spent by `user` (no refill happens within the test)."""
    limits = msgspec.convert(TIERS[tier] | {"name": tier}, TierConfig)
    rates = limiter._rates_for(limits)
    entry = limiter._users.get(user)
    state = None if entry is None else entry.budgets.get(tier)  # its budget in that tier
    if state is None:
        return 0
    left = policy.remaining(
        state.token_tat_us, limiter._now_us(), rates.token_window_us, rates.token_capacity
    )
    return rates.token_capacity - left


def _usage_totals(sqlite_path: str) -> dict[str, tuple[int, int, int]]:
    async def read() -> dict[str, tuple[int, int, int]]:
        store = SQLiteUsageStore(sqlite_path)
        try:
            rows = await store.query()
        finally:
            await store.aclose()
        return {r.user: (r.input_tokens, r.output_tokens, r.requests) for r in rows}

    return asyncio.run(read())


def test_usage_totals_equal_the_limiters_charges(tmp_path: Path) -> None:
    server = start_server(tmp_path, {"tiers": TIERS})
    try:
        limiter = server.app.state.runtime.pipeline.limiter
        assert isinstance(limiter, MemoryLimiter)
        with httpx.Client(timeout=60) as client:
            # Paid: streams to the end, cancelled streams, a plain answer, a client that hangs up.
            assert _stream(client, server, "paid", _body("Tell me a story", 24))[-1] == DONE
            for _ in range(3):
                assert (
                    _stream(client, server, "paid", _body("Count slowly to fifty", 400), cancel=True)[-1]
                    == DONE
                )
            plain = client.post(
                server.base_url + CHAT, json=_body("hi", 16, stream=False), headers=server.auth("paid")
            )
            assert plain.status_code == 200
            with client.stream(
                "POST", server.base_url + CHAT, json=_body("go on", 300), headers=server.auth("paid")
            ) as r:
                next(r.iter_lines())  # then hang up mid-stream
            # Refused before admission: costs nothing, records nothing.
            too_long = client.post(
                server.base_url + CHAT, json=_body("hi", 10_000), headers=server.auth("paid")
            )
            assert too_long.status_code == 400

            # Free: short requests, then a stream the token budget stops, then a 429.
            assert _stream(client, server, "free", _body("hi", 8))[-1] == DONE
            # Seeded to run long (no end token for LONG_TOKENS): only the budget can stop it.
            with httpx.Client(base_url=server.base_url, timeout=60) as seeker:
                seed = find_long_seed(seeker, server.keys["paid"])
            long_run = {
                "model": MODEL,
                "messages": LONG_PROMPT,
                "seed": seed,
                "max_tokens": 400,
                "stream": True,
            }
            cut = _stream(client, server, "free", long_run)
            assert cut[-2].get("floodgate") == {"limit_reached": "tokens"}, cut[-3:]
            assert _stream(client, server, "free", _body("hi", 8)) == [429]

        # Nothing refunds or charges after the edge stops: read the limiter now, the usage after.
        charged = {
            user: _charged(limiter, user, tier)
            for user, tier in (("paid-user", "paid"), ("free-user", "free"))
        }
    finally:
        server.stop()

    usage = _usage_totals(server.settings.keys.sqlite_path)
    assert charged["free-user"] == FREE_BUDGET  # the budget stop spent the budget exactly
    assert {user: inp + out for user, (inp, out, _) in usage.items()} == charged
    # The 400 and the 429 are not usage; the seed search made one paid request per seed it tried.
    seed_search = _SEED_CANDIDATES.index(seed) + 1
    assert usage["paid-user"][2] == 6 + seed_search and usage["free-user"][2] == 2


def test_a_user_sees_only_their_own_usage(tmp_path: Path) -> None:
    with start_server(tmp_path, {"tiers": ROOMY_TIERS}) as server, httpx.Client(timeout=60) as client:
        for who in ("paid", "free"):
            done = client.post(
                server.base_url + CHAT, json=_body("hi", 4, stream=False), headers=server.auth(who)
            )
            assert done.status_code == 200
        expected = done.json()["usage"]
        # Written off the request path: poll until the row is there.
        for _ in range(200):
            mine = client.get(server.base_url + "/v1/usage", headers=server.auth("free")).json()["data"]
            if mine:
                break
            time.sleep(0.02)
        assert [(r["user"], r["input_tokens"], r["output_tokens"], r["requests"]) for r in mine] == [
            ("free-user", expected["prompt_tokens"], expected["completion_tokens"], 1)
        ]
        for name, day in (("start", "yesterday"), ("start", "2026-13-01"), ("end", "2026-02-30")):
            bad = client.get(server.base_url + "/v1/usage", params={name: day}, headers=server.auth("free"))
            assert bad.status_code == 400, day  # no such day: not an empty list
            assert bad.json()["error"]["param"] == name
        assert client.get(server.base_url + "/v1/usage").status_code == 401


def test_a_failing_store_answers_503_not_500(tmp_path: Path) -> None:
    """A store that cannot answer is the store's trouble: 503 + Retry-After and an error object."""
    with start_server(tmp_path, {"tiers": ROOMY_TIERS}) as server, httpx.Client(timeout=60) as client:
        assert client.get(server.base_url + "/v1/usage", headers=server.auth("free")).status_code == 200
        with sqlite3.connect(tmp_path / "keys.db") as db:
            db.execute("DROP TABLE usage")
        broken = client.get(server.base_url + "/v1/usage", headers=server.auth("free"))
        assert broken.status_code == 503
        assert int(broken.headers["retry-after"]) >= 1
        assert broken.json()["error"]["code"] == "store_unavailable"


def test_an_answer_not_streamed_cut_by_the_drain_costs_nothing(tmp_path: Path) -> None:
    """The drain's deadline answers a request not streamed with the 503 alone, which tells the
    client to send it again: it pays nothing for it, as for a 401 when its key ends (it paid the
    prompt and what the replica made before, so a retry paid twice)."""
    drain = {"tiers": TIERS, "server": {"drain_accept_s": 60.0, "drain_deadline_s": 1.0}}
    server = start_server(tmp_path, drain)
    try:
        limiter = server.app.state.runtime.pipeline.limiter
        assert isinstance(limiter, MemoryLimiter)
        with httpx.Client(base_url=server.base_url, timeout=60) as seeker:
            seed = find_long_seed(seeker, server.keys["paid"])
        spent_on_seeds = _charged(limiter, "paid-user", "paid")
        body = {"model": MODEL, "messages": LONG_PROMPT, "seed": seed, "max_tokens": 1000}
        answers: list[httpx.Response] = []
        request = threading.Thread(
            target=lambda: answers.append(
                httpx.post(server.base_url + CHAT, json=body, headers=server.auth("paid"), timeout=60)
            )
        )
        request.start()
        # Polled: nothing tells the test when the replica runs it; an early answer stops the wait.
        wait_for_engine(server, lambda r: r.running == 1 or bool(answers), "the replica to run it")
        # Held still, so the deadline finds the request running on any machine.
        with engines_held(server):
            server.drain()
            request.join(60)
        (answer,) = answers
        assert answer.status_code == 503, answer.text[:200]
        assert answer.json()["error"]["code"] == "server_shutting_down"
        charged = _charged(limiter, "paid-user", "paid")
    finally:
        server.stop()
    assert charged == spent_on_seeds  # before: its prompt and what the replica had made, too
    seed_search = _SEED_CANDIDATES.index(seed) + 1
    assert _usage_totals(server.settings.keys.sqlite_path)["paid-user"][2] == seed_search
