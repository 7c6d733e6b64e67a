"""Schemathesis against the edge's own OpenAPI document: whatever a client sends, no 5xx, and every
answer is one the document describes (its status, its content type, its body's schema: an error is
the OpenAI error object the document names, not Litestar's `{status_code, detail}` it used to).

The document (edge/openapi.py, served at /schema/openapi.json) carries the chat request's real
bounds, so Schemathesis generates requests that fit them (positive) and requests that break them
(negative), for every operation in it, with a valid key (the admin key on /v1/admin/*). The number
of examples is bounded and their order fixed (derandomized), so the run is quick and the same every
time.

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
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)
from schemathesis.core.result import Err, Ok

from edge.keys.record import hash_key
from edge.openapi import SCHEMA_PATH
from tests.edge.conftest import ROOMY_TIERS
from tests.support.live_server import LiveServer, start_server

EXAMPLES_PER_OPERATION = 15
ADMIN_KEY = "fg-admin-schemathesis-test"
# Operations with no parameter, no body and no key: there is no invalid request to make of them.
NOTHING_TO_BREAK = {"/healthz", "/readyz"}
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
# Generations stay short: a fuzzed request may ask for a stream, and each one runs for real.
SHORT_TIERS = {name: {**tier, "max_tokens": 8} for name, tier in ROOMY_TIERS.items()}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    settings = {"tiers": SHORT_TIERS, "keys": {"admin_key_sha256": hash_key(ADMIN_KEY)}}
    with start_server(tmp_path_factory.mktemp("schemathesis"), settings) as live:
        yield live


def _fuzz(operation: Any, mode: GenerationMode, server: LiveServer) -> None:
    key = ADMIN_KEY if operation.path.startswith("/v1/admin/") else server.keys["paid"]

    @hypothesis.given(case=operation.as_strategy(generation_mode=mode))
    @hypothesis.settings(
        max_examples=EXAMPLES_PER_OPERATION,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(hypothesis.HealthCheck),
    )
    def run(case: Any) -> None:
        response = case.call(base_url=server.base_url, headers={"Authorization": f"Bearer {key}"}, timeout=30)
        case.validate_response(response, checks=CHECKS)

    run()


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_every_answer_is_a_documented_one(server: LiveServer, mode: GenerationMode) -> None:
    schema = schemathesis.openapi.from_url(server.base_url + SCHEMA_PATH + "/openapi.json")
    results = list(schema.get_all_operations())
    assert [r.err() for r in results if isinstance(r, Err)] == []  # the document itself is valid
    operations = [r.ok() for r in results if isinstance(r, Ok)]
    assert any(op.path == "/v1/chat/completions" and op.method.upper() == "POST" for op in operations)

    for operation in operations:
        if mode is GenerationMode.NEGATIVE and operation.path in NOTHING_TO_BREAK:
            continue
        _fuzz(operation, mode, server)
