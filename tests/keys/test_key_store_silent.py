"""A key store gone silent (a black-holed DynamoDB endpoint: connections accepted, never answered):
the requests whose keys are not cached get a 503 in seconds, not after the client's every retry."""

from __future__ import annotations

import asyncio
import secrets
import socket
from collections.abc import Iterator

import anyio
import pytest

import edge.keys.authenticator as authenticator
from edge.dynamodb_client import dynamodb_client
from edge.errors import ApiError
from edge.keys.authenticator import Authenticator
from edge.keys.dynamodb import DynamoDBKeyStore


@pytest.fixture
def silent_endpoint(monkeypatch: pytest.MonkeyPatch) -> Iterator[socket.socket]:
    """A real listener that takes connections and never answers (the kernel accepts them)."""
    for name, value in (
        ("AWS_ACCESS_KEY_ID", "test"),
        ("AWS_SECRET_ACCESS_KEY", "test"),
        ("AWS_DEFAULT_REGION", "us-east-1"),
    ):
        monkeypatch.setenv(name, value)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(256)
    with listener:
        yield listener


@pytest.mark.anyio
async def test_keys_not_cached_get_a_503_in_seconds_while_the_store_is_silent(
    silent_endpoint: socket.socket, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The edge's own client (5 s read timeout, 3 attempts) held each request about 20 s before its
    503, and past the 40 worker threads every store call shares, 60 users' requests queued behind
    one another for 40 s: as long as the outage lasted, a hang for every user not cached."""
    monkeypatch.setattr(authenticator, "LOOKUP_WAIT_S", 0.5)
    store = DynamoDBKeyStore(dynamodb_client(f"http://127.0.0.1:{silent_endpoint.getsockname()[1]}"), "keys")
    auth = Authenticator(store, ttl_s=5.0)

    async def answer(key: str) -> int:
        try:
            await auth.authenticate(f"Bearer {key}")
        except ApiError as refused:
            return refused.status
        return 200

    keys = [f"fg-{secrets.token_urlsafe(32)}" for _ in range(60)]
    with anyio.fail_after(5):
        answers = await asyncio.gather(*(answer(key) for key in keys))
    # A 503 (retry), never a 401 telling a user their key is wrong.
    assert set(answers) == {503}
    # The reads go on without the requests (a retry finds the answer cached, once there is one).
    reads = list(auth._reads.values())
    assert len(reads) == len(keys)
    silent_endpoint.close()  # the connections waiting are reset: the reads fail, and end
    await asyncio.wait(reads)
    await store.aclose()
