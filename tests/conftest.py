"""Session-wide test setup shared by every area. Area fixtures live in tests/<area>/conftest.py."""

from __future__ import annotations

import pytest

from tests.server_marker import mark_server_tests

# The files that take longest (seconds of one process, from CI's durations on 2 cores), run first.
# `make test` hands whole files to its processes in collection order (--dist loadfile
# --no-loadscope-reorder; xdist's default order, by count of tests, put these one- and two-test
# files last): started last, the iac checks' 105 s ran alone after everything else, and a
# fresh-clone CI took 10 min 20 s.
LONGEST_FIRST = (
    "tests/iac/test_iac_checks.py",
    "tests/edge/test_edge_goals_bench.py",
    "tests/edge/test_workers.py",
    "tests/faults/test_drain.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Marks the tests that start real servers (tests/server_marker.py): `-m "not server"` is the
    fast loop of unit tests. And puts the longest files first (LONGEST_FIRST), the rest in order."""
    mark_server_tests(items)
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
