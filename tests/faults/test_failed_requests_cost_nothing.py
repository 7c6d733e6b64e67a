"""A request the replica refuses (400) or fails before its first token (502) costs its user nothing:
not one of the tier's requests, not its prompt's tokens. OpenAI bills no 4xx or 5xx answer, and the
edge's own refusals were already refunded whole; the replica's were charged as if answered, so a
free user (a handful of requests an hour) lost one to every failure they could do nothing about."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import httpx

from edge.config import Settings
from edge.upstreams.base import Delta, GenerationRequest, Upstream
from edge.upstreams.local_pool import PrivateUpstreams, local_upstreams
from gpu_container.contract import UpstreamError
from tests.edge.conftest import ROOMY_TIERS
from tests.edge.sse_client import CHAT, MODEL
from tests.faults.test_bad_input_replica import _small_replicas
from tests.support.live_server import start_server

ONE_REQUEST = {"tiers": {"paid": ROOMY_TIERS["paid"] | {"requests_per_window": 1, "request_window_s": 3600}}}
SHORT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def test_a_request_the_replica_refuses_uses_none_of_the_users_requests(tmp_path: Path) -> None:
    too_long = SHORT | {"messages": [{"role": "user", "content": "tell me a story " * 40}]}
    with start_server(tmp_path, ONE_REQUEST, _small_replicas) as server:
        with httpx.Client(base_url=server.base_url, timeout=60.0, headers=server.auth("paid")) as client:
            refused = client.post(CHAT, json=too_long)
            answered = client.post(CHAT, json=SHORT)
    assert refused.status_code == 400, refused.text
    assert "refused" in refused.json()["error"]["message"]
    assert answered.status_code == 200, answered.text  # the tier's one request was still there
    assert answered.headers["x-ratelimit-remaining-requests"] == "0"


class _FailsBeforeItsFirstToken:
    """A replica whose generations all fail before a token (its connection reset mid-prefill)."""

    generate_direct = None  # the inner engine's callback path would bypass generate()

    def __init__(self, inner: Upstream) -> None:
        self._inner = inner
        self.name = inner.name

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def generate(self, req: GenerationRequest) -> AsyncIterator[Delta]:
        return self._fail()

    async def _fail(self) -> AsyncIterator[Delta]:
        raise UpstreamError("connection reset by the replica")
        yield  # a generator that fails when first read


def _failing_replicas(settings: Settings, model_dir: Path) -> AbstractAsyncContextManager[list[Upstream]]:
    @asynccontextmanager
    async def provide() -> AsyncIterator[list[Upstream]]:
        async with local_upstreams(settings, model_dir) as ups:
            yield PrivateUpstreams([_FailsBeforeItsFirstToken(up) for up in ups])  # type: ignore[misc]

    return provide()


def test_a_request_the_replica_fails_before_its_first_token_uses_none_of_the_users_requests(
    tmp_path: Path,
) -> None:
    with start_server(tmp_path, ONE_REQUEST, _failing_replicas) as server:
        with httpx.Client(base_url=server.base_url, timeout=60.0, headers=server.auth("paid")) as client:
            first, second = client.post(CHAT, json=SHORT), client.post(CHAT, json=SHORT | {"stream": True})
    assert first.status_code == 502, first.text
    assert first.json()["error"]["code"] == "upstream_error"
    # Not a 429: the failed request gave the tier's one request back.
    assert second.status_code != 429, second.text
