"""Session-wide test setup shared by every area. Area fixtures live in tests/<area>/conftest.py."""

from __future__ import annotations

import functools
import ssl
from collections.abc import Callable

import pytest

from tests.server_marker import mark_server_tests

# The files that take longest (seconds of one process, from CI's durations on 2 cores), run first,
# longest first. `make test` hands whole files to its processes in collection order (--dist loadfile
# --no-loadscope-reorder; xdist's default order, by count of tests, put these one- and two-test
# files last): started last, the iac checks' 105 s ran alone after everything else, and a
# fresh-clone CI took 10 min 20 s. Every file past 20 s is here: with only the first four, files of
# 24-42 s (mostly waiting on servers) were among the last handed out, and the run's last 50 s kept
# the two cores about 45 % idle while they finished.
LONGEST_FIRST = (
    "tests/faults/test_drain.py",
    "tests/iac/test_iac_checks.py",
    "tests/edge/test_edge_goals_bench.py",
    "tests/faults/test_engine_restart.py",
    "tests/browser/test_playground.py",
    "tests/edge/test_workers.py",
    "tests/membership/test_edge_servers.py",
    "tests/deploy/test_edge_image_models.py",
    "tests/edge/test_fleet.py",
    "tests/edge/test_cli.py",
    "tests/limiter/test_redis_cluster.py",
    "tests/iac/test_example_plan.py",
    "tests/admission/test_cancel_bus.py",
    "tests/triton/test_launcher.py",
    "tests/deploy/test_host_agent.py",
    "tests/triton/test_refused_request_on_edge.py",
    "tests/edge/test_ttft_overhead_bench.py",
)


def _one_default_tls_context() -> None:
    """Every httpx client the tests make (each `httpx.get`, `httpx.post` and `httpx.stream` makes
    one) shares one default TLS context. httpx builds a context per client, loading the CA bundle:
    about 20 ms of CPU each, for clients that speak plain HTTP on loopback and never use it. In the
    polling loops that wait for a server to start, that was a fifth of a core spent beside the
    server starting on the same two cores (tests/edge/test_workers.py: 28 s of CPU, 22 s with one
    context). A context is safe to share between threads and clients; a test that wants another
    (verify=False, its own CA) passes it and gets it, as before. Where httpx no longer builds its
    contexts there, nothing changes."""
    from httpx._transports import default

    build: Callable[..., ssl.SSLContext] | None = getattr(default, "create_ssl_context", None)
    if build is None or getattr(build, "shared", False):
        return
    make = build
    shared = functools.cache(lambda: make())

    @functools.wraps(make)
    def create_ssl_context(
        verify: ssl.SSLContext | str | bool = True, cert: object = None, trust_env: bool = True
    ) -> ssl.SSLContext:
        if verify is True and cert is None and trust_env:
            return shared()
        return make(verify=verify, cert=cert, trust_env=trust_env)

    create_ssl_context.shared = True  # type: ignore[attr-defined]
    setattr(default, "create_ssl_context", create_ssl_context)  # noqa: B010 (httpx's module, not ours)


_one_default_tls_context()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Marks the tests that start real servers (tests/server_marker.py): `-m "not server"` is the
    fast loop of unit tests. And puts the longest files first (LONGEST_FIRST), the rest in order."""
    mark_server_tests(items)
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
