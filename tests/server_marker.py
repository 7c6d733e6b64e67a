"""Which tests start real servers: the `server` marker, applied at collection (tests/conftest.py).

`pytest -m "not server"` is the fast loop: pure unit tests, no redis-server, no edge, no Triton, no
moto or dynalite, no browser. `make test` runs both. A test is a server test when
- it uses, directly or through other fixtures, a fixture that starts one (SERVER_FIXTURES),
- it is parametrized onto a store that is a server (SERVER_PARAMS: `backend`/`store_endpoint` =
  "dynamodb" asks for dynalite by name at run time, which the fixture closure cannot show),
- its module holds one of the helpers that start one (SERVER_STARTERS), or
- it says so itself: `@pytest.mark.server` (a test that runs `floodgate serve` through subprocess).
Deciding from what a test uses, not from a list of files, keeps a new test classified without
anyone remembering to.
"""

from __future__ import annotations

from collections.abc import Iterable

import pytest

SERVER = "server"

SERVER_FIXTURES = frozenset(
    {
        # tests/support
        "live_server",
        "local_triton",
        # tests/edge, tests/client, tests/golden, tests/browser
        "server",
        "local_server",
        "triton_server",
        "local_edge",
        "triton_edge",
        "page_server",
        "browser",
        # tests/limiter: redis-server
        "redis_server",
        "own_redis_server",
        # tests/fleet, tests/scaling: moto; tests/messages, tests/keys: dynalite
        "moto_endpoint",
        "dynalite_endpoint",
        # tests/triton: moto as S3
        "s3_endpoint",
    }
)

SERVER_PARAMS = {"backend": "dynamodb", "store_endpoint": "dynamodb"}

# (module, name) of what starts a server when called: matched on the objects a test module holds,
# without importing them here (moto and tritonclient are slow to import, and a helper may move).
SERVER_STARTERS = frozenset(
    {
        ("tests.support.live_server", "start_server"),
        ("tests.support.redis_server", "start_redis"),
        ("tests.support.redis_server", "start_redis_cluster"),
        ("tests.support.triton_server", "shared_local_triton"),
        ("tests.support.triton_server", "own_local_triton"),
        ("tests.faults.serve_process", "serve_process"),
        ("tests.messages.dynalite", "running_dynalite"),
        ("tests.support.moto_server", "running_moto"),
        ("tests.support.flaky_proxy", "flaky_proxy"),
        ("tests.support.late_listener", "late_listener"),
        ("tests.support.stalling_proxy", "stalling_proxy"),
        ("gpu_container.triton.launcher", "start_local_triton"),
        ("moto.moto_server.threaded_moto_server", "ThreadedMotoServer"),
        ("http.server", "HTTPServer"),
        ("http.server", "ThreadingHTTPServer"),
    }
)


def _module_starts_servers(module: object) -> bool:
    return any(
        (getattr(value, "__module__", None), getattr(value, "__qualname__", None)) in SERVER_STARTERS
        for value in vars(module).values()
    )


def starts_servers(item: pytest.Item) -> bool:
    if SERVER_FIXTURES.intersection(getattr(item, "fixturenames", ())):
        return True
    callspec = getattr(item, "callspec", None)
    if callspec is not None and any(
        callspec.params.get(name) == value for name, value in SERVER_PARAMS.items()
    ):
        return True
    module = getattr(item, "module", None)
    return module is not None and _module_starts_servers(module)


def mark_server_tests(items: Iterable[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker(SERVER) is None and starts_servers(item):
            item.add_marker(pytest.mark.server)
