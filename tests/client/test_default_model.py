"""A request without `model` goes to the key's default, which the client looks up once (GET /v1/models)
and keeps. When the key moves to a tier that may not use that model, the edge answers 404
model_not_found: the client looks the default up again and retries once, for a model it chose itself;
a model the caller named is the caller's to fix."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anyio
import httpx
import pytest

from edge.keys.record import ADMIN_KEY_PREFIX, hash_key, new_secret
from floodgate_client import AsyncClient, Client, NotFoundError
from tests.client.live import OVERRIDES
from tests.support.live_server import LiveServer, start_server

# As the embedded defaults serve them: the paid tier defaults to LARGE, which free keys may not use.
SMALL, LARGE = "floodgate-tiny", "floodgate-large"
ADMIN_KEY = new_secret(ADMIN_KEY_PREFIX)
TWO_MODELS: dict[str, Any] = {
    "models": {SMALL: {"source": "demo"}, LARGE: {"source": "demo"}},
    "tiers": {
        "paid": {**OVERRIDES["tiers"]["paid"], "models": [LARGE, SMALL], "default_model": LARGE},
        "free": {**OVERRIDES["tiers"]["free"], "requests_per_window": 100, "models": [SMALL]},
    },
    "keys": {"admin_key_sha256": hash_key(ADMIN_KEY)},
}


@pytest.fixture(scope="module")
def two_models(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with start_server(tmp_path_factory.mktemp("edge-two-models"), overrides=TWO_MODELS) as live:
        yield live


class Mover:
    """A key of its own on the paid tier, which the admin API moves to the free tier."""

    def __init__(self, server: LiveServer, user: str) -> None:
        self._admin = httpx.Client(
            base_url=server.base_url, headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=10.0
        )
        made = self._admin.post("/v1/admin/keys", json={"user": user, "tier": "paid"})
        assert made.status_code == 201, made.text
        self.key: str = made.json()["key"]
        self._id: str = made.json()["id"]

    def move_to_free(self) -> None:
        # The edge that moves a key forgets its cached record at once (edge/keys/lifecycle.py).
        moved = self._admin.post(f"/v1/admin/keys/{self._id}/tier", json={"tier": "free"})
        assert moved.status_code == 200, moved.text
        self._admin.close()


def test_a_key_moved_to_another_tier_gets_its_new_default_model(two_models: LiveServer) -> None:
    mover = Mover(two_models, "mover-sync")
    with Client(two_models.base_url, mover.key) as client:
        client.chat.create("hi", max_tokens=2)
        assert client.chat._default_model == LARGE
        mover.move_to_free()
        # Before the fix: NotFoundError 404 model_not_found, on this and every later request.
        result = client.chat.create("hi again", max_tokens=2)
        assert result.request_id and client.chat._default_model == SMALL
        with client.chat.stream("and again", max_tokens=2) as stream:
            assert stream.until_finished().reason in ("stop", "length")
        # A model the caller named is not replaced: the 404 is the caller's.
        with pytest.raises(NotFoundError) as caught:
            client.chat.create("hi", model=LARGE, max_tokens=2)
        assert caught.value.code == "model_not_found"


def test_an_async_client_whose_key_moved_gets_its_new_default_model(two_models: LiveServer) -> None:
    mover = Mover(two_models, "mover-async")

    async def main() -> None:
        async with AsyncClient(two_models.base_url, mover.key) as client:
            await client.chat.create("hi", max_tokens=2)
            assert client.chat._default_model == LARGE
            mover.move_to_free()
            result = await client.chat.create("hi again", max_tokens=2)
            assert result.request_id and client.chat._default_model == SMALL
            with pytest.raises(NotFoundError):
                await client.chat.create("hi", model=LARGE, max_tokens=2)

    anyio.run(main)
