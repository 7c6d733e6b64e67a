"""A request without `model` goes to the key's default of the moment: the client leaves the choice to
the edge ("model": ""), so a key moved to another tier gets that tier's default at its next request,
either way. (A default the client looked up once went stale: moved down, every request was a 404
model_not_found; moved up, a paid key kept the free tier's model for the client's lifetime.) A model
the caller named is the caller's to fix."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import anyio
import httpx
import pytest

from edge.keys.record import ADMIN_KEY_PREFIX, hash_key, new_secret
from floodgate_client import AsyncClient, Client, NotFoundError
from tests.client.live import OVERRIDES
from tests.edge.conftest import finished_by_model, served_models
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
    """A key of its own, which the admin API moves between tiers."""

    def __init__(self, server: LiveServer, user: str, tier: str) -> None:
        self._admin = httpx.Client(
            base_url=server.base_url, headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=10.0
        )
        made = self._admin.post("/v1/admin/keys", json={"user": user, "tier": tier})
        assert made.status_code == 201, made.text
        self.key: str = made.json()["key"]
        self._id: str = made.json()["id"]

    def move_to(self, tier: str) -> None:
        # The edge that moves a key forgets its cached record at once (edge/keys/lifecycle.py).
        moved = self._admin.post(f"/v1/admin/keys/{self._id}/tier", json={"tier": tier})
        assert moved.status_code == 200, moved.text

    def close(self) -> None:
        self._admin.close()


def _served_by(server: LiveServer, ask: Callable[[], object]) -> str:
    """The model that served what `ask` sent (the module's tests run one at a time)."""
    before = finished_by_model(server)
    ask()
    (model,) = served_models(before, finished_by_model(server))
    return model


@pytest.mark.parametrize(
    ("first", "then", "before", "after"), [("paid", "free", LARGE, SMALL), ("free", "paid", SMALL, LARGE)]
)
def test_a_key_moved_to_another_tier_gets_its_new_default_model(
    two_models: LiveServer, first: str, then: str, before: str, after: str
) -> None:
    mover = Mover(two_models, f"mover-sync-{first}", first)
    try:
        with Client(two_models.base_url, mover.key) as client:
            assert _served_by(two_models, lambda: client.chat.create("hi", max_tokens=2)) == before
            mover.move_to(then)
            assert _served_by(two_models, lambda: client.chat.create("hi again", max_tokens=2)) == after
            if then == "free":  # a model the caller named is not replaced: the 404 is the caller's
                with pytest.raises(NotFoundError) as caught:
                    client.chat.create("hi", model=LARGE, max_tokens=2)
                assert caught.value.code == "model_not_found"
    finally:
        mover.close()


def test_an_async_client_whose_key_moved_gets_its_new_default_model(two_models: LiveServer) -> None:
    mover = Mover(two_models, "mover-async", "free")
    served: list[str] = []

    async def main() -> None:
        async with AsyncClient(two_models.base_url, mover.key) as client:  # one client throughout
            for prompt, tier in (("hi", None), ("hi again", "paid"), ("and again", "free")):
                if tier is not None:
                    mover.move_to(tier)
                before = finished_by_model(two_models)
                await client.chat.create(prompt, max_tokens=2)
                served.extend(served_models(before, finished_by_model(two_models)))
            with pytest.raises(NotFoundError):
                await client.chat.create("hi", model=LARGE, max_tokens=2)

    try:
        anyio.run(main)
    finally:
        mover.close()
    assert served == [SMALL, LARGE, SMALL]
