"""The `server` marker finds a test's servers by the helpers its module holds (tests/server_marker.py),
matched by module and name: a helper that moves without its entry there leaves every test that
calls it in the fast loop, starting servers where `-m "not server"` promises none. (flaky_proxy
moved to tests/support once and its entry did not follow.)"""

from __future__ import annotations

import importlib
import importlib.util

import pytest

from tests.server_marker import SERVER_STARTERS


@pytest.mark.parametrize(("module", "name"), sorted(SERVER_STARTERS))
def test_every_server_starter_is_where_the_marker_looks(module: str, name: str) -> None:
    if not module.startswith("tests."):
        # Outside tests/ (moto, http.server, the Triton launcher): moto is slow to import; found is enough.
        assert importlib.util.find_spec(module) is not None, module
        return
    found = getattr(importlib.import_module(module), name, None)
    assert found is not None, f"{module} has no {name}"
    assert (found.__module__, found.__qualname__) == (module, name)
