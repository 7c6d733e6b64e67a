"""Drill: the local engine's child process killed (SIGKILL: out of memory, a segfault in BLAS).

The stream on it ends with an error event and [DONE], and the edge does not stay down: a new child
takes over, /readyz turns ready again, the next request is answered in full and /metrics counts the
restart. Before, the dead
replica stayed dead: /healthz said ok while every chat got 503 no_replica until someone restarted
the whole edge.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import httpx

from tests.edge.sse_client import CHAT, DONE, LONG_PROMPT, MODEL, events, wait_until
from tests.support.live_server import start_server

RECOVERY_TIMEOUT_S = 60.0


def _engine_children() -> set[int]:
    """This process's engine children (the edge runs in a thread here, its engines are ours)."""
    me = os.getpid()
    found = set()
    for task in Path(f"/proc/{me}/task").iterdir():
        for pid in (task / "children").read_text().split():
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except FileNotFoundError:
                continue
            if b"gpu_container.engine.engine_process" in cmdline:
                found.add(int(pid))
    return found


def test_a_killed_engine_process_is_replaced_and_the_edge_serves_again(tmp_path: Path) -> None:
    before = _engine_children()
    with start_server(tmp_path) as server:
        (doomed,) = _engine_children() - before
        body = {"model": MODEL, "messages": LONG_PROMPT, "stream": True, "ignore_eos": True}
        with httpx.stream(
            "POST",
            server.base_url + CHAT,
            json=body | {"max_tokens": 1000},
            headers=server.auth("paid"),
            timeout=30.0,
        ) as open_stream:
            stream = events(open_stream)
            next(stream)
            os.kill(doomed, signal.SIGKILL)
            rest = list(stream)
        assert rest[-1] == DONE
        assert any(isinstance(event, dict) and "error" in event for event in rest)

        # A client retrying as the official SDK does (5xx again, after the 503's Retry-After, or a
        # short pause after a 502: a request placed on the replica in the moment between its
        # child's death and the health poll that noticed it fails over to nothing) gets its reply
        # once the new child serves; before, it got 503 for ever.
        deadline = time.monotonic() + RECOVERY_TIMEOUT_S
        while True:
            answered = httpx.post(
                server.base_url + CHAT,
                json=body | {"stream": False, "max_tokens": 16},
                headers=server.auth("paid"),
                timeout=30.0,
            )
            if answered.status_code not in (502, 503):
                break
            assert time.monotonic() < deadline, "the edge did not come back"
            time.sleep(float(answered.headers.get("Retry-After", "0.1")))
        assert answered.status_code == 200, answered.text
        assert answered.json()["usage"]["completion_tokens"] == 16
        (replacement,) = _engine_children() - before
        assert replacement != doomed
        assert httpx.get(server.base_url + "/readyz").status_code == 200
        # The operator sees it: the replica's restarts, from the health poll's capacity read.
        wait_until(
            lambda: 'floodgate_replica_restarts{replica="local-0"} 1.0' in server.metrics_text(),
            RECOVERY_TIMEOUT_S,
            "the restart in /metrics",
        )
