"""A stream ends when the key that admitted it stops being active (edge/keys/stream_watch.py).

Before, the key was checked at admission only: a key revoked mid-stream kept streaming to the end
(max_tokens, finish_reason "length"), and so did one that expired mid-stream. Each test reads a long
stream (ignore_eos, MAX_TOKENS tokens) to its end and asserts what it carried: an OpenAI-style 401
error event naming the reason, then [DONE], long before MAX_TOKENS; the replica's sequence freed;
the user's concurrency slot given back (its tier allows one stream).

Where a clock ends the stream (an expiry, the cache TTL) the real model serves it: the demo model
makes 1,500 tokens a second on a fast machine, half of MAX_TOKENS before a 2-second expiry, where
the real model makes a few dozen; an event (an announcement, an admin call) ends it at once.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from edge.keys.lifecycle import KeyLifecycle
from edge.keys.record import ADMIN_KEY_PREFIX, hash_key, key_id, new_secret
from edge.keys.sqlite import SQLiteKeyStore
from gpu_container.checkpoint.bundled import MODEL_NAME
from tests.edge.conftest import (
    ROOMY_TIERS,
    EngineReading,
    finished_requests,
    idle_engine,
    wait_for_engine,
    wait_for_engine_to_drop,
)
from tests.edge.sse_client import CHAT, DONE, LONG_PROMPT, MODEL, events
from tests.support.live_server import LiveServer, start_server
from tests.support.redis_server import start_redis
from tests.support.smollm2 import smollm2_dir

ADMIN_KEY = new_secret(ADMIN_KEY_PREFIX)
MAX_TOKENS = 4000
# The stream is read this far before the key changes: it is generating then.
READ_BEFORE = 20
# Far longer than any test: only the watch's own timers or an announcement can end a stream in time.
LONG_TTL_S = 3600.0
SHORT_TTL_S = 0.5
# A key's life in the tests of its expiry: long enough that the stream has its first tokens before it
# ends (the real model's prefill on a starved machine: eight test processes on two cores, a 2 s key
# expired before its request's first token, usage 0), far short of MAX_TOKENS' generation.
EXPIRES_IN_S = 4.0
TIERS = {"paid": ROOMY_TIERS["paid"] | {"max_tokens": MAX_TOKENS, "max_concurrent": 1}}
BODY = {
    "model": MODEL,
    "messages": LONG_PROMPT,
    "max_tokens": MAX_TOKENS,
    "ignore_eos": True,
    "stream": True,
    "stream_options": {"include_usage": True},
}

REVOKED = {
    "message": "This API key has been revoked.",
    "type": "invalid_request_error",
    "param": None,
    "code": "invalid_api_key",
}
EXPIRED = REVOKED | {"message": "This API key has expired."}


def _settings(
    keys_db: Path, ttl_s: float, limiter: dict[str, Any] | None = None, real_model: bool = False
) -> dict[str, Any]:
    model = {"model": {"path": str(smollm2_dir()), "name": MODEL_NAME}} if real_model else {}
    return model | {
        "tiers": TIERS,
        # Room for MAX_TOKENS after the prompt (the default context is 2,048).
        "engine": {"max_model_len": MAX_TOKENS + 96},
        "limiter": limiter or {"backend": "memory"},
        "keys": {
            "sqlite_path": str(keys_db),
            "cache_ttl_s": ttl_s,
            "admin_key_sha256": hash_key(ADMIN_KEY),
        },
    }


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    server = start_redis()
    yield server.url
    server.stop()


@pytest.fixture(scope="module")
def short_ttl_real_edge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """The real model behind SHORT_TTL_S, shared by the two tests that need both: its start is most
    of a second and a half of CPU. Each test makes keys of a user of its own and reads the edge's
    counters against its own baseline; the one that breaks the store mends it before it returns."""
    tmp = tmp_path_factory.mktemp("short-ttl")
    with start_server(tmp / "edge", _settings(tmp / "keys.db", SHORT_TTL_S, real_model=True)) as edge:
        yield edge


def _admin(edge: LiveServer, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    answer = httpx.post(
        f"{edge.base_url}/v1/admin/keys{path}",
        json=body or {},
        headers={"Authorization": f"Bearer {ADMIN_KEY}"},
    )
    assert answer.status_code in (200, 201), answer.text
    made: dict[str, Any] = answer.json()
    return made


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _served(edge: LiveServer) -> str:
    """The model the edge serves: the demo model, or the real one (`real_model=True`)."""
    return edge.settings.model.name


def _stream(edge: LiveServer, key: str, on_generating: Any = None) -> list[Any]:
    """Every event of one stream to its end; `on_generating()` once READ_BEFORE events came."""
    with (
        httpx.Client(base_url=edge.base_url, timeout=60.0) as client,
        client.stream("POST", CHAT, json=BODY | {"model": _served(edge)}, headers=_auth(key)) as response,
    ):
        assert response.status_code == 200, response.read()
        got: list[Any] = []
        for item in events(response):
            if isinstance(item, str) and item.startswith(":"):
                continue  # keep-alive comment
            got.append(item)
            if len(got) == READ_BEFORE and on_generating is not None:
                on_generating()
    return got


def _ended_for_its_key(got: list[Any], error: dict[str, Any]) -> None:
    """Its usage, an error event saying why and [DONE]; long before MAX_TOKENS."""
    assert got[-1] == DONE, got[-3:]
    assert got[-2] == {"error": error}, got[-3:]
    usage = got[-3]["usage"]
    assert 0 < usage["completion_tokens"] < MAX_TOKENS // 2, usage
    assert not any(
        isinstance(e, dict) and e.get("choices") and e["choices"][0].get("finish_reason") for e in got
    )


def _baseline(edge: LiveServer) -> tuple[EngineReading, float]:
    """The replica idle, and the requests ended for their key so far (the count is the process's)."""
    return idle_engine(edge), finished_requests(edge, "key_inactive")


def _freed(edge: LiveServer, before: tuple[EngineReading, float], user_key: str) -> httpx.Response:
    """The replica dropped the sequence, and the user's one concurrency slot is free again."""
    after = wait_for_engine_to_drop(edge, before[0])
    assert after.work - before[0].work < MAX_TOKENS
    assert finished_requests(edge, "key_inactive") == before[1] + 1
    # The tier allows one stream at a time: a short request with the user's other key is admitted.
    short = httpx.post(
        edge.base_url + CHAT,
        json={"model": _served(edge), "messages": LONG_PROMPT, "max_tokens": 2},
        headers=_auth(user_key),
        timeout=60.0,
    )
    assert short.status_code == 200, short.text
    return short


def _store_reads(edge: LiveServer) -> float:
    line = next(
        line
        for line in edge.metrics_text().splitlines()
        if line.startswith('floodgate_key_lookups_total{source="store"}')
    )
    return float(line.split()[-1])


def _break_the_store(edge: LiveServer) -> None:
    """Every read of the key store fails until `_mend_the_store`, as a DynamoDB or a disk that
    stopped answering would (a stand-in: nothing breaks the embedded SQLite store's WAL on cue)."""
    store = edge.app.state.runtime.keys.store

    async def unreachable(key_sha256: str) -> None:
        raise OSError("the key store stopped answering")

    loop = edge._server.loop
    assert loop is not None
    loop.call_soon_threadsafe(setattr, store, "get", unreachable)


def _mend_the_store(edge: LiveServer) -> None:
    """The store's own reads again: on the edge's loop, queued before any later request of a test."""
    store = edge.app.state.runtime.keys.store
    loop = edge._server.loop
    assert loop is not None
    loop.call_soon_threadsafe(lambda: store.__dict__.pop("get", None))


def _revoke_in_store(keys_db: Path, key: str) -> None:
    """As `floodgate keys revoke` does without Redis: in the store, announced to no edge."""

    async def revoke() -> None:
        store = SQLiteKeyStore(keys_db)
        try:
            await KeyLifecycle(store, TIERS, rotation_grace_s=0.0).revoke(key_id(hash_key(key)))
        finally:
            await store.aclose()

    asyncio.run(revoke())


def test_a_key_revoked_in_the_store_ends_its_stream_within_the_cache_ttl(
    short_ttl_real_edge: LiveServer,
) -> None:
    edge = short_ttl_real_edge
    keys_db = Path(edge.settings.keys.sqlite_path)
    key = _admin(edge, "", {"user": "ann", "tier": "paid"})["key"]
    other = _admin(edge, "", {"user": "ann", "tier": "paid"})["key"]
    before = _baseline(edge)
    got = _stream(edge, key, lambda: _revoke_in_store(keys_db, key))
    _ended_for_its_key(got, REVOKED)
    _freed(edge, before, other)
    assert httpx.get(edge.base_url + "/v1/models", headers=_auth(key)).status_code == 401


def test_a_revocation_announced_over_redis_ends_a_stream_on_another_edge_at_once(
    tmp_path: Path, redis_url: str
) -> None:
    keys_db = tmp_path / "keys.db"
    limiter = {"backend": "redis", "redis_url": redis_url, "instance_count": 2, "timeout_ms": 2000}
    settings = _settings(keys_db, LONG_TTL_S, limiter)
    with start_server(tmp_path / "a", settings) as a, start_server(tmp_path / "b", settings) as b:
        made = _admin(a, "", {"user": "bo", "tier": "paid"})
        other = _admin(a, "", {"user": "bo", "tier": "paid"})["key"]
        before = _baseline(b)
        # Streamed on b, revoked on a: with an hour's cache TTL only the announcement reaches b.
        got = _stream(b, made["key"], lambda: _admin(a, f"/{made['id']}/revoke"))
        _ended_for_its_key(got, REVOKED)
        _freed(b, before, other)


def test_a_key_that_expires_mid_stream_ends_it_at_its_expiry(tmp_path: Path) -> None:
    settings = _settings(tmp_path / "keys.db", LONG_TTL_S, real_model=True)
    with start_server(tmp_path / "edge", settings) as edge:
        other = _admin(edge, "", {"user": "cy", "tier": "paid"})["key"]
        before = _baseline(edge)
        key = _admin(edge, "", {"user": "cy", "tier": "paid", "expires_in_s": EXPIRES_IN_S})["key"]
        got = _stream(edge, key)
        _ended_for_its_key(got, EXPIRED)
        _freed(edge, before, other)


def test_a_key_that_expires_while_the_key_store_is_down_ends_its_stream_at_its_expiry(
    short_ttl_real_edge: LiveServer,
) -> None:
    """A review: with the store unreadable at the expiry, the watch retried at once, again and again
    (thousands of reads a second), and the stream ran past its expiry until the store came back. A
    known expiry needs no read: nothing extends one."""
    edge = short_ttl_real_edge
    before = _baseline(edge)
    key = _admin(edge, "", {"user": "fa", "tier": "paid", "expires_in_s": EXPIRES_IN_S})["key"]
    reads_before = _store_reads(edge)
    try:
        got = _stream(edge, key, lambda: _break_the_store(edge))
        _ended_for_its_key(got, EXPIRED)
        wait_for_engine_to_drop(edge, before[0])
        # A read a TTL (0.5 s) at most while it streamed, not one per loop turn.
        assert _store_reads(edge) - reads_before < 30
    finally:
        _mend_the_store(edge)


def test_a_key_rotated_mid_stream_ends_it_when_its_grace_ends(tmp_path: Path) -> None:
    with start_server(tmp_path / "edge", _settings(tmp_path / "keys.db", LONG_TTL_S)) as edge:
        made = _admin(edge, "", {"user": "di", "tier": "paid"})
        before = _baseline(edge)
        rotated: dict[str, Any] = {}

        def rotate() -> None:
            rotated.update(_admin(edge, f"/{made['id']}/rotate", {"grace_s": 0.5}))

        got = _stream(edge, made["key"], rotate)
        _ended_for_its_key(got, EXPIRED)
        _freed(edge, before, rotated["key"])


def test_a_non_streaming_request_whose_key_is_revoked_mid_generation_is_answered_401(
    tmp_path: Path,
) -> None:
    with start_server(tmp_path / "edge", _settings(tmp_path / "keys.db", LONG_TTL_S)) as edge:
        made = _admin(edge, "", {"user": "ed", "tier": "paid"})
        other = _admin(edge, "", {"user": "ed", "tier": "paid"})["key"]
        before = _baseline(edge)
        answers: list[httpx.Response] = []
        request = threading.Thread(
            target=lambda: answers.append(
                httpx.post(
                    edge.base_url + CHAT,
                    json={k: v for k, v in BODY.items() if k not in ("stream", "stream_options")},
                    headers=_auth(made["key"]),
                    timeout=60.0,
                )
            )
        )
        request.start()
        try:
            # Polled: nothing tells the test when the replica starts; an early answer stops the wait.
            wait_for_engine(edge, lambda r: r.running == 1 or bool(answers), "the replica to run it")
            _admin(edge, f"/{made['id']}/revoke")
        finally:
            request.join(60.0)
        (answer,) = answers
        assert answer.status_code == 401, answer.text[:200]
        assert answer.json() == {"error": REVOKED}
        assert answer.headers["x-request-id"].startswith("chatcmpl-")
        short = _freed(edge, before, other)
    # The client got the 401 alone, which cost it nothing: the short request is the user's first.
    assert (
        int(short.headers["x-ratelimit-limit-requests"])
        - int(short.headers["x-ratelimit-remaining-requests"])
        == 1
    )
