"""Schemathesis against the edge's own OpenAPI document: whatever a client sends, no 5xx.

The document (edge/openapi.py, served at /schema/openapi.json) carries the chat request's real
bounds, so Schemathesis generates requests that fit them (positive) and requests that break them
(negative), for every operation in it, with a valid key. The number of examples is bounded and their
order fixed (derandomized), so the run is quick and the same every time.

Schemathesis's lazy pytest loader (`from_fixture`) does not run on pytest 9 (it reads a private
node attribute), so each operation's Hypothesis strategy is driven here directly.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import hypothesis
import pytest
import schemathesis
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.result import Err, Ok

from edge.openapi import SCHEMA_PATH
from tests.edge.conftest import ROOMY_TIERS
from tests.support.live_server import LiveServer, start_server

EXAMPLES_PER_OPERATION = 15
# Generations stay short: a fuzzed request may ask for a stream, and each one runs for real.
SHORT_TIERS = {name: {**tier, "max_tokens": 8} for name, tier in ROOMY_TIERS.items()}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with start_server(tmp_path_factory.mktemp("schemathesis"), {"tiers": SHORT_TIERS}) as live:
        yield live


def _fuzz(operation: Any, mode: GenerationMode, server: LiveServer) -> None:
    @hypothesis.given(case=operation.as_strategy(generation_mode=mode))
    @hypothesis.settings(
        max_examples=EXAMPLES_PER_OPERATION,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(hypothesis.HealthCheck),
    )
    def run(case: Any) -> None:
        response = case.call(base_url=server.base_url, headers=server.auth("paid"), timeout=30)
        case.validate_response(response, checks=[not_a_server_error])

    run()


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_no_request_gets_a_server_error(server: LiveServer, mode: GenerationMode) -> None:
    schema = schemathesis.openapi.from_url(server.base_url + SCHEMA_PATH + "/openapi.json")
    results = list(schema.get_all_operations())
    assert [r.err() for r in results if isinstance(r, Err)] == []  # the document itself is valid
    operations = [r.ok() for r in results if isinstance(r, Ok)]
    assert any(op.path == "/v1/chat/completions" and op.method.upper() == "POST" for op in operations)

    for operation in operations:
        _fuzz(operation, mode, server)
