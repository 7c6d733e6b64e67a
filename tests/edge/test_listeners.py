"""What each listener serves, on a real server: the public one everything but the operator
endpoints; the operator one (`[server] ops_port`) only those, the health probes and the admin API.

The operator listener answered the whole app before: from the groups allowed to scrape it, a chat
request, the playground and a key's usage answered there, past the WAF and the load balancer's TLS.
A route the listener does not serve is the same JSON 404 as one that does not exist."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
from litestar import Litestar, get, post
from litestar.exceptions import ImproperlyConfiguredException
from prometheus_client import CONTENT_TYPE_LATEST

from edge.config import ServerConfig, Settings
from edge.keys.record import hash_key
from edge.openapi import SCHEMA_PATH
from edge.routes.listeners import OPERATOR_ONLY, path_listeners
from edge.server import Listeners, bind_listeners
from edge.upstreams.base import Upstream
from tests.edge.sse_client import CHAT, MODEL
from tests.support import live_server
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


# Every method a client may try, OPTIONS (which Litestar answers itself for each path) included.
METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
# Where each listener's routes are not served (edge/routes/listeners.py).
NOT_PUBLIC = ("/metrics", "/v1/internal/engine")
NOT_OPERATOR = (
    CHAT,
    "/v1/chat/completions/req-1/cancel",
    "/v1/conversations/conv-1/messages",
    "/v1/models",
    "/v1/models/floodgate-tiny",
    "/v1/usage",
    "/",
    SCHEMA_PATH + "/openapi.json",
)


def _answer(client: httpx.Client, method: str, path: str) -> tuple[int, str | None, bytes]:
    """An unknown path's 404 names its method and path (edge/errors.py), alike but for the path."""
    answer = client.request(method, path)
    return answer.status_code, answer.headers.get("allow"), answer.content.replace(path.encode(), b"PATH")


def _unlike_an_unknown_path(base_url: str, paths: tuple[str, ...]) -> dict[str, object]:
    """Each (method, path) whose answer differs from that method's answer for a path that does
    not exist, with what it answered."""
    with httpx.Client(base_url=base_url, timeout=30) as client:
        unknown = {method: _answer(client, method, "/no-such-path") for method in METHODS}
        assert all(a[0] == 404 and a[1] is None for a in unknown.values()), unknown
        return {
            f"{method} {path}": answer
            for path in paths
            for method in METHODS
            if (answer := _answer(client, method, path)) != unknown[method]
        }


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


def test_readiness_names_the_replicas_only_on_the_operator_listener(server: LiveServer) -> None:
    """The public /readyz listed every replica by name, its internal address (host:port for
    Triton), to whoever reached the public listener where no load balancer filters it. It answers
    the status alone there, with the same status code; the operator listener keeps the detail."""
    public = httpx.get(server.base_url + "/readyz", timeout=30)
    ops = httpx.get(server.ops_url + "/readyz", timeout=30)
    assert (public.status_code, public.json()) == (200, {"status": "ready"})
    assert ops.status_code == 200 and ops.json()["status"] == "ready"
    assert ops.json()["replicas"] and all(ops.json()["replicas"].values())


def _media_parameters(content_type: str) -> list[str]:
    """The parameter names of a Content-Type, as a media-type parser reads them (lower case)."""
    return [part.split("=", 1)[0].strip().lower() for part in content_type.split(";")[1:]]


def test_the_metrics_page_names_its_format_once(server: LiveServer) -> None:
    """A scraper picks its parser from the page's Content-Type: Prometheus 3 parses it with Go's
    mime.ParseMediaType, which refuses a parameter named twice ("mime: duplicate parameter name"),
    and then fails the scrape (it no longer falls back to the text format). The page said
    `charset=utf-8; charset=utf-8`: prometheus_client's type, which names its charset, and Litestar's
    own charset added to every text/ type."""
    with httpx.Client(base_url=server.ops_url, timeout=30) as ops:
        answers = [ops.get("/metrics"), ops.head("/metrics")]
    for answer in answers:
        assert answer.status_code == 200
        content_type = answer.headers["content-type"]
        assert content_type == CONTENT_TYPE_LATEST
        names = _media_parameters(content_type)
        assert len(names) == len(set(names)), content_type


def test_the_public_listener_serves_everything_but_the_operator_endpoints(server: LiveServer) -> None:
    with httpx.Client(base_url=server.base_url, timeout=30) as public:
        assert public.post(CHAT, json=ASK, headers=server.auth("paid")).status_code == 200
        assert public.get("/").status_code == 200
        assert public.get("/healthz").status_code == 200
        paths = ("/metrics", "//metrics", "/v1/internal/engine")
        answers = {path: public.get(server.base_url + path) for path in paths}  # "//" kept as sent
    assert all(_is_not_found(a) for a in answers.values()), {p: a.status_code for p, a in answers.items()}


def test_a_route_the_listener_does_not_serve_is_an_unknown_path_for_every_method(
    server: LiveServer,
) -> None:
    """Litestar answers a method a path lacks with 405 and an Allow header, and OPTIONS with 204
    and the same list, both before any middleware runs: the public listener named the operator
    endpoints' methods (OPTIONS /metrics: GET), the operator listener the chat API's, where a
    GET was a 404."""
    assert _unlike_an_unknown_path(server.base_url, NOT_PUBLIC) == {}
    assert _unlike_an_unknown_path(server.ops_url, NOT_OPERATOR) == {}


def test_options_answers_alike_on_each_listener_that_serves_the_path(server: LiveServer) -> None:
    """Litestar's OPTIONS answer is a route of its own, which named no listener: public only, so
    the operator listener answered OPTIONS /healthz (or /metrics) 404 while it serves the path."""
    with httpx.Client(timeout=30) as client:
        answers = {
            (where, path): (answer.status_code, answer.headers.get("allow"))
            for where, base in (("public", server.base_url), ("operator", server.ops_url))
            for path in ("/healthz", "/readyz", "/metrics")
            if (where, path) != ("public", "/metrics")
            for answer in [client.options(base + path)]
        }
    probe = (204, "GET, HEAD, OPTIONS")
    assert answers == {
        ("public", "/healthz"): probe,
        ("public", "/readyz"): probe,
        ("operator", "/healthz"): probe,
        ("operator", "/readyz"): probe,
        ("operator", "/metrics"): (204, "GET, HEAD, OPTIONS"),
    }


def test_every_unknown_path_under_the_schema_is_an_unknown_path(server: LiveServer) -> None:
    """Litestar served a catch-all under the documents' prefix: GET /schema/swagger answered an HTML
    404 page, OPTIONS 204 and POST 405 (Allow: GET, OPTIONS), where any other unknown path answers
    the JSON 404 for every method. The documents themselves are still served."""
    unknown = (SCHEMA_PATH + "/swagger", SCHEMA_PATH + "/redoc", SCHEMA_PATH + "/openapi.yaml")
    assert _unlike_an_unknown_path(server.base_url, unknown) == {}
    for document in (SCHEMA_PATH, SCHEMA_PATH + "/openapi.json"):
        answer = httpx.get(server.base_url + document, timeout=30)
        assert answer.status_code == 200 and "/v1/chat/completions" in answer.json()["paths"]


# Each answer's own: its time, and an error answer's id (edge/request_ids.py new_refusal_id).
_PER_ANSWER = {"date", "x-request-id"}


def _seen(answer: httpx.Response) -> tuple[int, dict[str, str], bytes]:
    headers = {k: v for k, v in answer.headers.items() if k not in _PER_ANSWER}
    return answer.status_code, headers, answer.content


def test_head_answers_wherever_get_does(server: LiveServer) -> None:
    """RFC 9110 9.1: a general-purpose server supports HEAD wherever it supports GET, with GET's
    status and headers (content-length included) and no body. Every GET-only route answered 405."""
    paid = server.auth("paid")
    routes = [
        (server.base_url, "/v1/models", paid),
        (server.base_url, "/v1/models/floodgate-tiny", paid),
        (server.base_url, "/v1/models/no-such-model", paid),  # GET's 404
        (server.base_url, "/v1/models", {}),  # GET's 401
        (server.base_url, "/healthz", {}),
        (server.base_url, "/readyz", {}),
        (server.base_url, "/", {}),
        (server.base_url, SCHEMA_PATH + "/openapi.json", {}),
        (server.ops_url, "/v1/internal/engine", {}),
        (server.ops_url, "/v1/admin/keys", ADMIN),
        (server.ops_url, "/v1/admin/keys", {}),  # the admin key is still asked for: GET's 401
    ]
    unlike_get: dict[str, object] = {}
    statuses = []
    with httpx.Client(timeout=30) as client:
        for base, path, auth in routes:
            head, get = (
                _seen(client.head(base + path, headers=auth)),
                _seen(client.get(base + path, headers=auth)),
            )
            statuses.append(head[0])
            if head != (get[0], get[1], b"") or "content-length" not in head[1]:
                unlike_get[f"HEAD {base}{path} {sorted(auth)}"] = (head, get[:2])
        # The page changes between two scrapes (its own counters): its length differs from GET's.
        metrics_head, metrics_get = (
            client.head(server.ops_url + "/metrics"),
            client.get(server.ops_url + "/metrics"),
        )
    assert unlike_get == {}
    assert statuses[:4] == [200, 200, 404, 401]
    assert metrics_head.status_code == metrics_get.status_code == 200 and metrics_head.content == b""
    assert metrics_head.headers["content-type"] == metrics_get.headers["content-type"]
    assert int(metrics_head.headers["content-length"]) > 0

    # Only a path with GET answers HEAD: the chat route (POST only) keeps its 405, and a HEAD to it
    # never reaches the limiter (nor the stream gate or the conversation log behind it).
    with httpx.Client(base_url=server.base_url, timeout=30) as client:
        before = client.post(CHAT, json=ASK, headers=paid)
        heads = [client.head(CHAT, headers=paid) for _ in range(3)]
        after = client.post(CHAT, json=ASK, headers=paid)
    assert {(h.status_code, frozenset(h.headers["allow"].split(", "))) for h in heads} == {
        (405, frozenset({"OPTIONS", "POST"}))
    }
    remaining = [int(a.headers["x-ratelimit-remaining-requests"]) for a in (before, after)]
    assert remaining[1] == remaining[0] - 1


def test_the_allow_header_lists_head_wherever_get_is_served(server: LiveServer) -> None:
    """RFC 9110 15.5.6 and 9.3.7: a 405's Allow and OPTIONS name the methods the path supports.
    Since HEAD is answered wherever GET is (edge/routes/head.py), both listed GET without HEAD on
    every GET-only path (Allow: GET, OPTIONS), where the health probes, which declare HEAD, list
    it: a client reading Allow was told HEAD was not supported where it is."""
    paid = server.auth("paid")
    paths = [
        (server.base_url, "/v1/models", "GET, HEAD, OPTIONS"),
        (server.base_url, "/v1/usage", "GET, HEAD, OPTIONS"),
        (server.base_url, "/", "GET, HEAD, OPTIONS"),
        (server.base_url, SCHEMA_PATH + "/openapi.json", "GET, HEAD, OPTIONS"),
        (server.ops_url, "/metrics", "GET, HEAD, OPTIONS"),
        (server.ops_url, "/v1/admin/usage", "GET, HEAD, OPTIONS"),
        (server.base_url, "/healthz", "GET, HEAD, OPTIONS"),
        # No GET: no HEAD either.
        (server.base_url, CHAT, "OPTIONS, POST"),
    ]
    with httpx.Client(timeout=30) as client:
        seen = {
            f"{method} {base}{path}": frozenset(
                client.request(method, base + path, headers=paid).headers["allow"].split(", ")
            )
            for base, path, _ in paths
            for method in ("OPTIONS", "DELETE")
        }
    wanted = {
        f"{method} {base}{path}": frozenset(allow.split(", "))
        for base, path, allow in paths
        for method in ("OPTIONS", "DELETE")
    }
    assert seen == wanted


def test_options_on_the_admin_api_needs_no_admin_key(server: LiveServer) -> None:
    """The admin API's guard ran on Litestar's OPTIONS answer too: OPTIONS /v1/admin/usage answered
    401 without the admin key, where every other path answers 204 and its methods."""
    paths = {
        "/v1/admin/usage": "GET, HEAD, OPTIONS",
        "/v1/admin/keys/key-1/rotate": "OPTIONS, POST",
        # GET and POST, two handlers: Litestar's own answer named POST's alone (litestar#4169).
        "/v1/admin/keys": "GET, HEAD, OPTIONS, POST",
    }
    with httpx.Client(timeout=30) as client:
        answers = {
            (base, path): (answer.status_code, answer.headers.get("allow"))
            for base in (server.base_url, server.ops_url)
            for path in paths
            for answer in [client.options(base + path)]
        }
    for (base, path), (status, allow) in answers.items():
        assert (status, allow) == (204, paths[path]), (base, path)


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


def test_with_the_admin_api_off_its_paths_are_unknown_paths_for_every_method(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Off, the admin routes still existed behind a guard: GET answered its own 404 ("Not found.",
    code not_found), DELETE a 405 listing the API's methods (GET, OPTIONS, POST)."""
    admin = ("/v1/admin/keys", "/v1/admin/keys/key-1/rotate", "/v1/admin/usage")
    with start_server(tmp_path_factory.mktemp("no-admin-methods")) as off:
        assert _unlike_an_unknown_path(off.base_url, admin) == {}
        assert _unlike_an_unknown_path(off.ops_url, admin) == {}


def test_a_path_split_between_listeners_is_refused_at_start() -> None:
    """Litestar's 405 and OPTIONS answers list every method of a path: a path whose methods were
    served on different listeners would name one listener's routes on the other."""

    @get("/split", opt=OPERATOR_ONLY)
    async def read() -> None: ...

    @post("/split")
    async def write() -> None: ...

    with pytest.raises(ImproperlyConfiguredException, match="/split"):
        path_listeners(Litestar(route_handlers=[read, write]))


@contextlib.asynccontextmanager
async def _no_replicas(settings: Settings, model_dir: Path) -> AsyncIterator[list[Upstream]]:
    raise RuntimeError("no replica starts")
    yield []  # an async generator (unreachable)


# uvicorn ends a failed start-up with sys.exit in the server's thread: expected here.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_server_whose_start_up_fails_leaves_both_its_ports_free(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A test server whose app failed to start (here its replicas) raised, and left both its
    listeners (public and operator) bound, their descriptors open in the test process for the rest
    of the run: nothing closed them. Both are closed now, the ports free at once."""
    addresses: list[tuple[str, int]] = []

    def recorded(server: ServerConfig, *, reuse_port: bool = False) -> Listeners:
        listeners = bind_listeners(server, reuse_port=reuse_port)
        addresses.extend(sock.getsockname() for sock in (listeners.public, listeners.ops))
        return listeners

    monkeypatch.setattr(live_server, "bind_listeners", recorded)
    with pytest.raises(RuntimeError, match="exited during start-up"):
        start_server(tmp_path, upstreams=_no_replicas)
    assert len(addresses) == 2
    for address in addresses:
        # Without SO_REUSEADDR: refused (EADDRINUSE) while any socket still holds the port.
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as again:
            again.bind(address)
