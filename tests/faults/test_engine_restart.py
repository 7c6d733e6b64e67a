"""Drill: the local engine's child process killed (SIGKILL: out of memory, a segfault in BLAS).

The stream on it ends with an error event and [DONE], and the edge does not stay down: a new child
takes over, /readyz turns ready again, the next request is answered in full and /metrics counts the
restart. Before, the dead
replica stayed dead: /healthz said ok while every chat got 503 no_replica until someone restarted
the whole edge.

A request that meets the crash before its first token waits for the new child, as it would for room
on a busy one: the edge restarts the engine itself, so it knows it is coming back (engine_process.py,
the dispatcher's "a crash is a wait").
"""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from edge.cancel.stream_close import aclose_stream
from edge.config import Settings
from edge.upstreams.base import Delta, GenerationRequest, ReplicaRestarting, Upstream
from edge.upstreams.local_pool import PrivateUpstreams, local_upstreams
from tests.edge.sse_client import CHAT, DONE, LONG_PROMPT, MODEL, content_of, events, wait_until
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
            # Past its first token (the first event, the role, is sent before the replica is asked):
            # a stream that got text cannot be retried, and ends with the error.
            while not content_of([next(stream)]):
                pass
            os.kill(doomed, signal.SIGKILL)
            rest = list(stream)
        assert rest[-1] == DONE
        assert any(isinstance(event, dict) and "error" in event for event in rest)

        # The next request waits for the new child (before, it got 503 for ever; then, a 502 or
        # 503s that the official SDK's retries ran out on before the new child served).
        answered = httpx.post(
            server.base_url + CHAT,
            json=body | {"stream": False, "max_tokens": 16},
            headers=server.auth("paid"),
            timeout=RECOVERY_TIMEOUT_S,
        )
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


@pytest.mark.parametrize("stream", [False, True], ids=["answer", "stream"])
def test_a_request_right_after_the_engine_process_dies_waits_for_the_new_one(
    tmp_path: Path, stream: bool
) -> None:
    """With one engine (`make serve`'s default) every crash met the requests of that moment with an
    error: a 502 for one placed on the dead child before the health poll saw it die (nowhere else
    to fail over to), a 503 no_replica after, Retry-After 1 s; the official SDK's two retries were
    spent 1.5 s after the kill while the real model served again 2.4 s after it. Streamed: a 200
    whose stream ended with an upstream_error event, which no SDK retries. Now either waits for the
    new child and gets its whole answer."""
    before = _engine_children()
    with start_server(tmp_path) as server:
        (doomed,) = _engine_children() - before
        os.kill(doomed, signal.SIGKILL)
        body: dict[str, Any] = {"model": MODEL, "messages": LONG_PROMPT, "max_tokens": 16, "ignore_eos": True}
        if stream:
            body |= {"stream": True, "stream_options": {"include_usage": True}}
        url, headers = server.base_url + CHAT, server.auth("paid")
        if stream:
            with httpx.stream("POST", url, json=body, headers=headers, timeout=RECOVERY_TIMEOUT_S) as sent:
                assert sent.status_code == 200, sent.read()
                got = [e for e in events(sent) if not (isinstance(e, str) and e.startswith(":"))]
            assert not [e for e in got if isinstance(e, dict) and "error" in e], got
            assert got[-1] == DONE
            assert got[-2]["usage"]["completion_tokens"] == 16
            assert got[-3]["choices"][0]["finish_reason"] == "length"
        else:
            answered = httpx.post(url, json=body, headers=headers, timeout=RECOVERY_TIMEOUT_S)
            assert answered.status_code == 200, answered.text
            assert answered.json()["usage"]["completion_tokens"] == 16
        (replacement,) = _engine_children() - before
        assert replacement != doomed


class _DiesAfterItsFirstToken:
    """The real engine, but a generation asking for DIES_AFTER_ONE tokens meets the engine process's
    death after its first delta, as the process reports it (ReplicaRestarting)."""

    generate_direct = None  # the inner engine's callback path would bypass generate()

    def __init__(self, inner: Upstream) -> None:
        self._inner = inner
        self.name = inner.name

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def generate(self, req: GenerationRequest) -> AsyncIterator[Delta]:
        return self._generate(req)

    async def _generate(self, req: GenerationRequest) -> AsyncIterator[Delta]:
        stream = self._inner.generate(req)
        try:
            async for delta in stream:
                yield delta
                if req.max_new_tokens == DIES_AFTER_ONE:
                    raise ReplicaRestarting("engine process exited unexpectedly (exit code -9)", RESTART_S)
        finally:
            await aclose_stream(stream)


DIES_AFTER_ONE, RESTART_S = 7, 2.5


def _dying_replicas(settings: Settings, model_dir: Path) -> AbstractAsyncContextManager[list[Upstream]]:
    @asynccontextmanager
    async def provide() -> AsyncIterator[list[Upstream]]:
        async with local_upstreams(settings, model_dir) as ups:
            yield PrivateUpstreams([_DiesAfterItsFirstToken(up) for up in ups])

    return provide()


def test_an_answer_whose_engine_died_after_its_first_token_says_when_to_retry(tmp_path: Path) -> None:
    """Past its first token a request is not run again (streamed, its text reached the client), so
    it fails; its 502 says when the restart should be over, which the official SDK honours. Without
    it, the SDK's two retries came 0.4 s and 1.4 s later and met the replica still down."""
    body = {"model": MODEL, "messages": LONG_PROMPT, "max_tokens": DIES_AFTER_ONE, "ignore_eos": True}
    with start_server(tmp_path, None, _dying_replicas) as server:
        failed = httpx.post(server.base_url + CHAT, json=body, headers=server.auth("paid"), timeout=30.0)
    assert failed.status_code == 502, failed.text
    assert failed.json()["error"]["code"] == "upstream_error"
    assert (failed.headers["retry-after"], failed.headers["retry-after-ms"]) == ("3", "2500")
