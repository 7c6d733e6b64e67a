"""`x-stainless-retry-count` is the client's to send, whatever it holds: no value of it is the
server's fault (edge/retry_count.py).

Read with int(), a count of more than 4,300 digits (Python's bound on converting a string to an
int) raised ValueError inside the chat route: any key holder's request answered 500, and each wrote
an `unhandled_error` line with its traceback and counted a 500 in
floodgate_requests_rejected_total, the signals an operator's alerts watch for the server's own
faults."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.edge.conftest import EDGE_SETTINGS
from tests.edge.sse_client import CHAT, MODEL
from tests.support.live_server import LiveServer, start_server

# Greedy: a sampled two-token reply may end at an end token ("stop").
BODY = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "temperature": 0}


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LiveServer]:
    with start_server(tmp_path, EDGE_SETTINGS) as live:
        yield live


@pytest.mark.parametrize("count", ["1" * 5000, "0" * 5000, "0" * 4999 + "3"])
def test_a_retry_count_of_any_length_is_served(server: LiveServer, count: str) -> None:
    headers = {**server.auth("free"), "x-stainless-retry-count": count}
    # The process's metrics are shared by every edge a test process started: an earlier test's
    # own 500 is counted there too.
    earlier = server.rejected(500)
    answer = httpx.post(server.base_url + CHAT, headers=headers, json=BODY, timeout=30.0)

    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["finish_reason"] == "length"
    assert server.rejected(500) == earlier
