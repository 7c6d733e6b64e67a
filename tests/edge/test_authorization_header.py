"""Every route reads a request's Authorization header alike: several are a 400, on a real server.

The chat route read the raw headers and kept the last Authorization header, the other routes (and
the admin API's guard) Litestar's first: one request authenticated as one key on one route and as
another on the next, and a proxy metering the first header saw a different key from the one the
edge billed (a review). Here two headers are refused everywhere, even two copies of a valid key,
and the model never runs for such a request."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from edge.keys.record import hash_key
from tests.edge.sse_client import CHAT, MODEL
from tests.support.live_server import LiveServer, start_server

ADMIN_KEY = "fgadmin-authorization-header-test"
ASK = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}

ROUTES = [
    ("POST", CHAT),
    ("GET", "/v1/models"),
    ("GET", f"/v1/models/{MODEL}"),
    ("GET", "/v1/usage"),
    ("POST", "/v1/chat/completions/chatcmpl-nope/cancel"),
    ("GET", "/v1/conversations/c1/messages"),
]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    settings = {"keys": {"admin_key_sha256": hash_key(ADMIN_KEY)}}
    with start_server(tmp_path_factory.mktemp("authorization-header"), settings) as live:
        yield live


def _two(first: str, second: str) -> list[tuple[str, str]]:
    return [("Authorization", f"Bearer {first}"), ("Authorization", f"Bearer {second}")]


@pytest.mark.parametrize(("method", "path"), ROUTES)
def test_several_authorization_headers_are_a_400_on_every_route(
    server: LiveServer, method: str, path: str
) -> None:
    good = server.keys["paid"]
    one = httpx.request(method, server.base_url + path, headers=server.auth("paid"), json=ASK, timeout=30)
    assert one.status_code != 400, one.text  # the route takes the same request with one header
    for headers in (_two("fg-not-a-key", good), _two(good, "fg-not-a-key"), _two(good, good)):
        answer = httpx.request(method, server.base_url + path, headers=headers, json=ASK, timeout=30)
        assert answer.status_code == 400, (headers, answer.text)
        error = answer.json()["error"]
        assert error["code"] == "several_authorization_headers"
        assert error["type"] == "invalid_request_error"
        assert good not in answer.text


def test_several_authorization_headers_are_a_400_for_the_admin_api(server: LiveServer) -> None:
    url = server.ops_url + "/v1/admin/keys"
    assert httpx.get(url, headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=30).status_code == 200
    for headers in (_two("fgadmin-wrong", ADMIN_KEY), _two(ADMIN_KEY, "fgadmin-wrong")):
        answer = httpx.get(url, headers=headers, timeout=30)
        assert answer.status_code == 400, answer.text
        assert answer.json()["error"]["code"] == "several_authorization_headers"


def test_a_refused_chat_request_never_reaches_the_model(server: LiveServer) -> None:
    good = server.keys["paid"]
    before = httpx.get(server.base_url + "/v1/usage", headers=server.auth("paid"), timeout=30).json()
    for _ in range(3):
        answer = httpx.post(server.base_url + CHAT, headers=_two(good, good), json=ASK, timeout=30)
        assert answer.status_code == 400
    after = httpx.get(server.base_url + "/v1/usage", headers=server.auth("paid"), timeout=30).json()
    assert after == before
