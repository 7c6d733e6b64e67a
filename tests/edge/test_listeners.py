"""What each listener serves, on a real server: the public one everything but the operator
endpoints; the operator one (`[server] ops_port`) only those, the health probes and the admin API.

The operator listener answered the whole app before: from the groups allowed to scrape it, a chat
request, the playground and a key's usage answered there, past the WAF and the load balancer's TLS.
A route the listener does not serve is the same JSON 404 as one that does not exist."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from edge.keys.record import hash_key
from edge.openapi import SCHEMA_PATH
from tests.edge.sse_client import CHAT, MODEL
from tests.support.live_server import LiveServer, start_server

ADMIN_KEY = "fg-admin-listeners-test"
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
ASK = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    settings = {"keys": {"admin_key_sha256": hash_key(ADMIN_KEY)}}
    with start_server(tmp_path_factory.mktemp("listeners"), settings) as live:
        yield live


def _is_not_found(answer: httpx.Response) -> bool:
    return answer.status_code == 404 and answer.json()["error"]["message"] != ""


def test_the_operator_listener_serves_only_what_operators_use(server: LiveServer) -> None:
    with httpx.Client(base_url=server.ops_url, timeout=30) as ops:
        chat = ops.post(CHAT, json=ASK, headers=server.auth("paid"))
        models = ops.get("/v1/models", headers=server.auth("paid"))
        usage = ops.get("/v1/usage", headers=server.auth("paid"))
        page = ops.get("/")
        served = [
            ops.get("/metrics"),
            ops.get("/v1/internal/engine"),
            ops.get("/healthz"),
            ops.get("/readyz"),
            ops.get("/v1/admin/keys", headers=ADMIN),
        ]
    assert all(_is_not_found(a) for a in (chat, models, usage, page)), [chat.text, page.status_code]
    assert [a.status_code for a in served] == [200] * 5


def test_the_public_listener_serves_everything_but_the_operator_endpoints(server: LiveServer) -> None:
    with httpx.Client(base_url=server.base_url, timeout=30) as public:
        assert public.post(CHAT, json=ASK, headers=server.auth("paid")).status_code == 200
        assert public.get("/").status_code == 200
        assert public.get("/healthz").status_code == 200
        paths = ("/metrics", "//metrics", "/v1/internal/engine")
        answers = {path: public.get(server.base_url + path) for path in paths}  # "//" kept as sent
    assert all(_is_not_found(a) for a in answers.values()), {p: a.status_code for p, a in answers.items()}


def test_a_new_key_is_never_kept_by_a_cache(server: LiveServer) -> None:
    made = httpx.post(
        f"{server.ops_url}/v1/admin/keys",
        json={"user": "listeners", "tier": "paid"},
        headers=ADMIN,
        timeout=30,
    )
    rotated = httpx.post(
        f"{server.ops_url}/v1/admin/keys/{made.json()['id']}/rotate", headers=ADMIN, timeout=30
    )
    assert made.status_code == 201 and rotated.status_code == 200
    assert made.headers["cache-control"] == rotated.headers["cache-control"] == "no-store"


def test_with_the_admin_api_off_the_document_does_not_list_it(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    with start_server(tmp_path_factory.mktemp("no-admin")) as off:
        paths = httpx.get(off.base_url + SCHEMA_PATH + "/openapi.json", timeout=30).json()["paths"]
        refused = httpx.get(off.ops_url + "/v1/admin/keys", headers=ADMIN, timeout=30)
    assert "/v1/chat/completions" in paths
    assert not [p for p in paths if p.startswith("/v1/admin")]
    assert refused.status_code == 404
