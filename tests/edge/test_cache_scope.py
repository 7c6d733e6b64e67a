"""`[admission] prefix_cache_scope`: one user's cached prompt prefix is no one else's to hit.

A shared cache would let a user learn from cached_tokens whether another user recently sent a
given prompt. Each test starts its own edge, so its replica's cache holds only what the test sent;
"free" and "free2" are two users of one tier, so they differ only in who they are.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from edge.upstreams.triton import triton_upstreams
from tests.edge.conftest import EDGE_SETTINGS
from tests.edge.sse_client import MODEL, wait_until
from tests.support.live_server import LiveServer, start_server
from tests.support.triton_server import LocalTriton

# Several KV blocks long, so a hit is plain to see.
SYSTEM = "You answer questions about rivers, lakes and the sea, briefly and kindly. " * 4


def _cached(server: LiveServer, who: str, question: str, system: str = SYSTEM) -> int:
    """The cached_tokens of one completion for user `who`, as the official SDK parses them."""
    with openai.OpenAI(base_url=server.base_url + "/v1", api_key=server.keys[who], max_retries=0) as sdk:
        completion = sdk.chat.completions.create(
            model=MODEL,
            messages=[{"role": "system", "content": system}, {"role": "user", "content": question}],
            max_tokens=4,
        )
    usage = completion.usage
    assert usage is not None and usage.prompt_tokens_details is not None
    cached = usage.prompt_tokens_details.cached_tokens
    assert cached is not None
    return cached


@pytest.fixture
def scoped_server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LiveServer]:
    settings = {**EDGE_SETTINGS, "admission": {"prefix_cache_scope": request.param}}
    with start_server(tmp_path, settings) as live:
        yield live


@pytest.mark.parametrize("scoped_server", ["user"], indirect=True)
def test_by_default_a_user_hits_only_its_own_cached_prefix(scoped_server: LiveServer) -> None:
    assert scoped_server.settings.admission.prefix_cache_scope == "user"  # the default
    assert _cached(scoped_server, "free", "Where do rivers start?") == 0
    assert _cached(scoped_server, "free", "Why is the sea salty?") > 0  # its own prefix, found again
    # Another user sending the very same prefix learns nothing: computed afresh, reported 0.
    assert _cached(scoped_server, "free2", "Why is the sea salty?") == 0
    # ... and then has a cache of its own.
    assert _cached(scoped_server, "free2", "What feeds a lake?") > 0


@pytest.mark.parametrize("scoped_server", ["shared"], indirect=True)
def test_a_shared_scope_lets_every_user_hit_the_prefix(scoped_server: LiveServer) -> None:
    assert _cached(scoped_server, "free", "Where do rivers start?") == 0
    assert _cached(scoped_server, "free2", "Why is the sea salty?") > 0


@pytest.mark.parametrize("scope", ["user", "shared"])
def test_on_triton_replicas_a_user_is_not_told_of_another_users_cached_prefix(
    tmp_path: Path, local_triton: LocalTriton, scope: str
) -> None:
    """A Triton replica cannot salt its cache (edge/upstreams/triton.py): one user's request reuses
    the blocks another's left. Under the "user" scope the figure must not say so, or a user learns
    from it whether another sent a prompt (a prefix guessed block by block); "shared" says it."""
    settings = {**EDGE_SETTINGS, "admission": {"prefix_cache_scope": scope}}
    system = f"{uuid.uuid4().hex} {SYSTEM}"  # the session's Triton outlives this test's edge
    with start_server(tmp_path, settings, triton_upstreams(local_triton.spec)) as live:
        _cached(live, "free", "Where do rivers start?", system)
        another_user = _cached(live, "free2", "Why is the sea salty?", system)
    assert (another_user > 0) == (scope == "shared")


@pytest.mark.parametrize("scope", ["user", "shared"])
def test_on_triton_replicas_the_stats_show_no_pooled_cache_hits_under_the_user_scope(
    tmp_path: Path, local_triton: LocalTriton, scope: str
) -> None:
    """The same hits, read from /v1/models/{id}/stats (any key): the replica's hit total grows by
    what a user's own guess found, another user's prompt included, wherever the cache is pooled."""
    settings = {**EDGE_SETTINGS, "admission": {"prefix_cache_scope": scope}}
    system = f"{uuid.uuid4().hex} {SYSTEM}"
    with start_server(tmp_path, settings, triton_upstreams(local_triton.spec)) as live:
        _cached(live, "free", "Where do rivers start?", system)
        _cached(live, "free2", "Why is the sea salty?", system)

        def figures() -> dict[str, Any] | None:
            url = f"{live.base_url}/v1/models/{MODEL}/stats"
            replica = httpx.get(url, headers=live.auth("free2"), timeout=5.0).json()["replicas"][0]
            found: dict[str, Any] | None = replica["figures"]
            return found

        if scope == "shared":
            # The last health poll's figures (about once a second): the hit shows soon.
            wait_until(
                lambda: bool((f := figures()) and f["prefix_cache"]["hit_tokens"] > 0),
                timeout_s=30,
                what="the replica's prefix-cache hit",
            )
        else:
            wait_until(lambda: figures() is not None, timeout_s=30, what="the replica's figures")
            found = figures()
            assert found is not None and found["prefix_cache"] is None
            assert found["kv_blocks"]["used"] >= 0  # the rest is shown as before


def _scopes_keeping(server: LiveServer, piece_start: str) -> set[str]:
    """The scopes under which the edge's tokenizer cache keeps a piece (edge/text/piece_cache.py)."""
    cache = server.app.state.runtime.pipeline.text._piece_cache
    assert cache is not None
    return {scope for scope, piece in cache._kept if piece.startswith(piece_start)}


@pytest.mark.parametrize(
    ("scoped_server", "scopes"), [("user", 2), ("shared", 1)], indirect=["scoped_server"]
)
def test_the_edges_kept_prompt_pieces_follow_the_same_scope(scoped_server: LiveServer, scopes: int) -> None:
    """How long the edge takes to encode a prompt must not tell a user what another one sent
    either: the system prompt's token ids are kept once per user, or once for all when shared."""
    _cached(scoped_server, "free", "Where do rivers start?")
    _cached(scoped_server, "free", "Why is the sea salty?")
    assert len(_scopes_keeping(scoped_server, "system\n" + SYSTEM[:20])) == 1
    _cached(scoped_server, "free2", "Why is the sea salty?")
    assert len(_scopes_keeping(scoped_server, "system\n" + SYSTEM[:20])) == scopes
