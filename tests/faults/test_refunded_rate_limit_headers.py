"""A request refunded whole (the replica failed it before its first token: the client got only an
error, and is charged nothing) answers with x-ratelimit-* headers that say what the user has left
after the refund, as OpenAI's describe the state after the request. They said the budget as charged
at admission: a user with one request an hour was told it had none left, while it had that one."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.edge.conftest import ROOMY_TIERS
from tests.edge.sse_client import CHAT
from tests.faults.test_failed_requests_cost_nothing import FAIL_AT_ONCE, SHORT, _failing_replicas
from tests.support.live_server import start_server

TOKENS = 100_000
# Windows so long nothing refills within the test: the headers move only by what is charged.
ONE_REQUEST = {
    "paid": ROOMY_TIERS["paid"]
    | {"requests_per_window": 1, "request_window_s": 3600, "tokens_per_window": TOKENS, "token_window_s": 1e9}
}


def test_a_refunded_failure_says_the_budget_it_left_untouched(
    tmp_path: Path, limiter_settings: dict[str, str]
) -> None:
    settings = {"tiers": ONE_REQUEST, "limiter": limiter_settings}
    with start_server(tmp_path, settings, _failing_replicas) as server:
        with httpx.Client(base_url=server.base_url, timeout=60.0, headers=server.auth("paid")) as client:
            failed = client.post(CHAT, json=SHORT | {"max_tokens": FAIL_AT_ONCE})
            answered = client.post(CHAT, json=SHORT)
    assert failed.status_code == 502, failed.text
    assert answered.status_code == 200, answered.text  # the refund was real: the one request is there
    assert failed.headers["x-ratelimit-remaining-requests"] == "1"
    assert failed.headers["x-ratelimit-reset-requests"] == "0s"
    assert failed.headers["x-ratelimit-remaining-tokens"] == str(TOKENS)
    assert failed.headers["x-ratelimit-reset-tokens"] == "0s"
    assert answered.headers["x-ratelimit-remaining-requests"] == "0"
