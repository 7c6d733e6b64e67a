"""Drill: the local engine's child process killed (SIGKILL: out of memory, a segfault in BLAS).

The stream on it ends with an error event and [DONE], and the edge does not stay down: a new child
takes over, /readyz turns ready again, the next request is answered in full and /metrics counts the
restart. Before, the dead
replica stayed dead: /healthz said ok while every chat got 503 no_replica until someone restarted
the whole edge.

A request that meets the crash before its first token waits for the new child, as it would for room
on a busy one: the edge restarts the engine itself, so it knows it is coming back (engine_process.py,
the dispatcher's "a crash is a wait"). Not one that was on a child that died within a minute of
replacing a dead one: it may be what killed it (a prompt that crashes the engine crashes every child
it is sent to), so it fails, with a 502 that asks the client not to send it again.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from edge.cancel.stream_close import aclose_stream
from edge.config import Settings
from edge.upstreams.base import Delta, GenerationRequest, ReplicaRestarting, Upstream
from edge.upstreams.local_pool import local_upstreams
from gpu_container.engine import engine_process
from gpu_container.engine.engine_process import EngineProcess
from gpu_container.engine.mailbox import Mailbox
from gpu_container.engine.types import SamplingParams
from tests.edge.conftest import ROOMY_TIERS
from tests.edge.sse_client import CHAT, DONE, LONG_PROMPT, MODEL, content_of, events, wait_until
from tests.support.live_server import LiveServer, demo_model_dir, start_server
from tests.support.ports import free_port
from tests.support.scripted_replicas import scripted_replicas

RECOVERY_TIMEOUT_S = 60.0


def _engine_children() -> set[int]:
    """This process's engine children (the edge runs in a thread here, its engines are ours)."""
    me = os.getpid()
    found = set()
    for task in Path(f"/proc/{me}/task").iterdir():
        try:
            children = (task / "children").read_text().split()
        except (FileNotFoundError, ProcessLookupError):
            continue  # a thread that ended meanwhile
        for pid in children:
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except (FileNotFoundError, ProcessLookupError):
                continue
            if b"gpu_container.engine.engine_process" in cmdline:
                found.add(int(pid))
    return found


def _dead(pid: int) -> bool:
    """Exited (a zombie until its reader reaps it), not merely sent SIGKILL."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError):
        # Reaped: gone, or going (a read racing the reap fails with ESRCH rather than ENOENT).
        return True


def _stop(pid: int) -> None:
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + RECOVERY_TIMEOUT_S
    while Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("T", "t"):
        assert time.monotonic() < deadline, "the child did not stop"


_STREAMED = {"model": MODEL, "messages": LONG_PROMPT, "stream": True, "ignore_eos": True}


def _cut_mid_stream(server: LiveServer, act: Callable[[], None], timeout_s: float) -> None:
    """A long stream, `act` done to its engine child past its first token (the first event, the
    role, is sent before the replica is asked: a stream that got text cannot be retried), and the
    stream ends with an error event and [DONE]."""
    with httpx.stream(
        "POST",
        server.base_url + CHAT,
        json=_STREAMED | {"max_tokens": 1000},
        headers=server.auth("paid"),
        timeout=timeout_s,
    ) as open_stream:
        stream = events(open_stream)
        while not content_of([next(stream)]):
            pass
        act()
        rest = list(stream)
    assert rest[-1] == DONE
    assert any(isinstance(event, dict) and "error" in event for event in rest)


def _served_by_a_new_child(server: LiveServer, before: set[int], gone: int) -> None:
    """The next request is answered whole, by an engine child other than `gone`."""
    answered = httpx.post(
        server.base_url + CHAT,
        json=_STREAMED | {"stream": False, "max_tokens": 16},
        headers=server.auth("paid"),
        timeout=RECOVERY_TIMEOUT_S,
    )
    assert answered.status_code == 200, answered.text
    assert answered.json()["usage"]["completion_tokens"] == 16
    (replacement,) = _engine_children() - before
    assert replacement != gone


def test_a_killed_engine_process_is_replaced_and_the_edge_serves_again(tmp_path: Path) -> None:
    before = _engine_children()
    with start_server(tmp_path) as server:
        (doomed,) = _engine_children() - before
        _cut_mid_stream(server, lambda: os.kill(doomed, signal.SIGKILL), 30.0)
        # The next request waits for the new child (before, it got 503 for ever; then, a 502 or
        # 503s that the official SDK's retries ran out on before the new child served).
        _served_by_a_new_child(server, before, doomed)
        assert httpx.get(server.base_url + "/readyz").status_code == 200
        # The operator sees it: the replica's restarts, from the health poll's capacity read.
        wait_until(
            lambda: 'floodgate_replica_restarts{model="",replica="local-0"} 1.0' in server.metrics_text(),
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
        # Sent once it is dead: one sent to a child still dying would have been on it when it died
        # (young), and may have killed it.
        wait_until(lambda: _dead(doomed), RECOVERY_TIMEOUT_S, "the child's exit")
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


DIES_AFTER_ONE, RESTART_S = 7, 2.5
SECOND_CRASH = ["first crash", "crash within a minute of another"]


def _dying_replicas(may_be_cause: bool) -> Any:
    """The real engine, but a generation asking for DIES_AFTER_ONE tokens meets the engine process's
    death after its first token, as the process reports it (ReplicaRestarting): a first crash
    (`may_be_cause` False), or one within a minute of another. The first token alone, not its
    last: a loaded machine's engine ran ahead of the reader, and its first delta held the whole
    reply, finish included, which ended the request with a 200 before the death came (a CI run)."""

    async def dying(inner: Upstream, req: GenerationRequest) -> AsyncIterator[Delta]:
        stream = inner.generate(req)
        try:
            async for delta in stream:
                if req.max_new_tokens != DIES_AFTER_ONE:
                    yield delta
                else:
                    yield replace(delta, token_ids=delta.token_ids[:1], finish_reason=None)
                    raise ReplicaRestarting(
                        "engine process exited unexpectedly (exit code -9)",
                        RESTART_S,
                        may_be_cause=may_be_cause,
                    )
        finally:
            await aclose_stream(stream)

    return scripted_replicas(dying)


@pytest.mark.parametrize("may_be_cause", [False, True], ids=SECOND_CRASH)
def test_an_answer_whose_engine_died_after_its_first_token_says_when_to_retry(
    tmp_path: Path, may_be_cause: bool
) -> None:
    """Past its first token a request is not run again (streamed, its text reached the client), so
    it fails; its 502 says when the restart should be over, which the official SDK honours. Without
    it, the SDK's two retries came 0.4 s and 1.4 s later and met the replica still down. Unless it
    may be what killed the engine: then it says not to retry (a request that crashes the engine
    after its first token, retried by the SDK when the new child served, crashed that one too)."""
    body = {"model": MODEL, "messages": LONG_PROMPT, "max_tokens": DIES_AFTER_ONE, "ignore_eos": True}
    with start_server(tmp_path, None, _dying_replicas(may_be_cause)) as server:
        failed = httpx.post(server.base_url + CHAT, json=body, headers=server.auth("paid"), timeout=30.0)
    assert failed.status_code == 502, failed.text
    assert failed.json()["error"]["code"] == "upstream_error"
    if may_be_cause:
        assert "retry-after" not in failed.headers
        assert failed.headers["x-should-retry"] == "false"
    else:
        assert (failed.headers["retry-after"], failed.headers["retry-after-ms"]) == ("3", "2500")
        assert "x-should-retry" not in failed.headers


@pytest.mark.parametrize("may_be_cause", [False, True], ids=SECOND_CRASH)
def test_a_stream_whose_engine_died_after_its_first_token_says_when_to_retry_in_its_error_event(
    tmp_path: Path, may_be_cause: bool
) -> None:
    """The same failure streamed: its status (200) and headers went out with the first event, so
    the error event is all the client hears. It said neither when nor whether to retry, where the
    502 above says both; its error object now carries them (`retry_after_ms`, `should_retry`),
    the four OpenAI fields kept, and the official SDK still raises it, the hint in its body."""
    body = {
        "model": MODEL,
        "messages": LONG_PROMPT,
        "max_tokens": DIES_AFTER_ONE,
        "ignore_eos": True,
        "stream": True,
    }
    with start_server(tmp_path, None, _dying_replicas(may_be_cause)) as server:
        with httpx.stream(
            "POST", server.base_url + CHAT, json=body, headers=server.auth("paid"), timeout=30.0
        ) as response:
            streamed = [e for e in events(response) if isinstance(e, dict | str) and e != ": keep-alive"]
        client = openai.OpenAI(base_url=server.base_url + "/v1", api_key=server.keys["paid"], max_retries=0)
        with pytest.raises(openai.APIError) as raised:
            for _ in client.chat.completions.create(
                model=MODEL,
                messages=LONG_PROMPT,  # type: ignore[arg-type]
                max_tokens=DIES_AFTER_ONE,
                stream=True,
                extra_body={"ignore_eos": True},
            ):
                pass
    assert response.status_code == 200 and streamed[-1] == DONE
    error = streamed[-2]["error"]
    assert {k: error[k] for k in ("type", "param", "code")} == {
        "type": "api_error",
        "param": None,
        "code": "upstream_error",
    }
    if may_be_cause:
        assert "retry_after_ms" not in error and error["should_retry"] is False
    else:
        assert error["retry_after_ms"] == 2500 and "should_retry" not in error
    assert raised.value.code == "upstream_error" and raised.value.body == error


# A request asking for this many tokens is one the engine's child dies on (`_Engines`); HELD, one
# the child holds without starting on it; STALLS, one the child hangs on, every time.
POISON, HELD, STALLS = 77, 55, 33


@dataclass
class _Engines:
    """The real engine processes, whose child dies when it is handed a request asking for POISON
    tokens (its handle kills it right after handing the request over, so the request is on the
    child when it dies), as on a prompt that crashes the engine: every time (`dies_on` None), or
    the first `dies_on` times, as when the kernel's OOM killer or an operator kills it then. The
    first request asking for HELD tokens stops the child before it starts on it (it is on the child,
    without a token, when the child dies); every one asking for STALLS does (a prompt that hangs the
    engine's step: the stall watch kills the child). Each restart waits for `restart_gate` when set: a restart
    lasts until the test lets it end."""

    dies_on: int | None = None
    restart_gate: threading.Event | None = None
    kills: list[int] = field(default_factory=list)
    holds: list[int] = field(default_factory=list)
    stalls: list[int] = field(default_factory=list)
    started: list[EngineProcess] = field(default_factory=list)

    def provider(self, settings: Settings, model_dir: Path) -> AbstractAsyncContextManager[list[Upstream]]:
        @asynccontextmanager
        async def provide() -> AsyncIterator[list[Upstream]]:
            async with local_upstreams(settings, model_dir) as ups:
                for up in ups:
                    assert isinstance(up, EngineProcess)
                    self._hook(up)
                    self.started.append(up)
                yield ups

        return provide()

    def _hook(self, process: EngineProcess) -> None:
        submit, spawn = process._submit, process._spawn

        def submit_then_die(req: GenerationRequest, params: SamplingParams, mailbox: Mailbox) -> None:
            pid = process.pid
            if req.max_new_tokens == HELD and not self.holds:
                # The child stopped before it starts on it: it holds this request when it next dies.
                assert pid is not None
                _stop(pid)
                self.holds.append(pid)
            if req.max_new_tokens == STALLS:
                assert pid is not None
                _stop(pid)
                self.stalls.append(pid)
            if req.max_new_tokens != POISON or (self.dies_on is not None and len(self.kills) >= self.dies_on):
                submit(req, params, mailbox)
                return
            assert pid is not None
            # Stopped first, so that it dies holding the request before its first token, however
            # long this thread waits for a core between the two.
            _stop(pid)
            submit(req, params, mailbox)
            self.kills.append(pid)
            os.kill(pid, signal.SIGKILL)

        def gated_spawn(*args: Any, **kwargs: Any) -> None:
            if self.restart_gate is not None:
                self.restart_gate.wait(RECOVERY_TIMEOUT_S)
            spawn(*args, **kwargs)

        process._submit = submit_then_die  # type: ignore[method-assign]
        process._spawn = gated_spawn  # type: ignore[method-assign]


ASK = [{"role": "user", "content": "hi there"}]


def _crash_first(server: LiveServer, engines: _Engines) -> None:
    """The engine's child killed while idle, and replaced: the new one serves (a request waits for
    it), and a crash of it within a minute is a second one."""
    (process,) = engines.started
    doomed = process.pid
    assert doomed is not None
    os.kill(doomed, signal.SIGKILL)
    wait_until(lambda: _dead(doomed), RECOVERY_TIMEOUT_S, "the child's exit")
    answered = httpx.post(
        server.base_url + CHAT,
        json={"model": MODEL, "messages": ASK, "max_tokens": 4},
        headers=server.auth("paid"),
        timeout=RECOVERY_TIMEOUT_S,
    )
    assert answered.status_code == 200, answered.text
    assert process.pid != doomed


@pytest.mark.parametrize(("crashed_before", "crashes"), [(False, 2), (True, 1)], ids=SECOND_CRASH)
def test_a_request_that_kills_the_engine_is_not_sent_back_to_it(
    tmp_path: Path, crashed_before: bool, crashes: int
) -> None:
    """A request that crashes the engine was sent back to each new child, and its 502 said when the
    next would serve: one such request through the official SDK (max_retries 2) crashed it 6 times
    (each attempt twice, each retry sent when the new child came up), the restart's pause doubled
    to 30 s, and the engine served again a minute later. Now a first crash is forgiven, once: the
    request is sent back to the new child (so are the others it held: a kill from outside, the OOM
    killer, costs them nothing), which it kills too; a crash of a child that replaced a dead one
    within a minute is not: its requests fail, with a 502 the SDK does not retry."""
    engines = _Engines()
    with start_server(tmp_path, None, engines.provider) as server:
        if crashed_before:
            _crash_first(server, engines)
        client = openai.OpenAI(base_url=server.base_url + "/v1", api_key=server.keys["paid"], max_retries=2)
        with pytest.raises(openai.InternalServerError) as failed:
            client.chat.completions.create(
                model=MODEL, messages=ASK, max_tokens=POISON, extra_body={"ignore_eos": True}
            )
        assert failed.value.status_code == 502
        assert "retry-after" not in failed.value.response.headers
        assert failed.value.response.headers["x-should-retry"] == "false"
        assert len(engines.kills) == crashes

        # The others are served by the new child.
        answered = httpx.post(
            server.base_url + CHAT,
            json={"model": MODEL, "messages": ASK, "max_tokens": 16, "ignore_eos": True},
            headers=server.auth("paid"),
            timeout=RECOVERY_TIMEOUT_S,
        )
        assert answered.status_code == 200, answered.text
        assert len(engines.kills) == crashes


def test_a_request_that_came_to_the_new_child_beside_one_sent_back_is_not_blamed_for_its_crash(
    tmp_path: Path,
) -> None:
    """A request that crashes the engine, sent back once after a first crash, kills the new child
    too, with the requests that came to it meanwhile: those were never on a dead child before, the
    one sent back was, so they are sent back once themselves and answered; it fails for good."""
    gate = threading.Event()
    engines = _Engines(restart_gate=gate)
    try:
        with start_server(tmp_path, {"tiers": ROOMY_TIERS}, engines.provider) as server:
            dispatcher = server.app.state.runtime.pipeline.dispatcher
            url = server.base_url + CHAT
            with ThreadPoolExecutor(2) as pool:
                # Free, so that the paid request beside it reaches the new child first.
                poison = pool.submit(
                    httpx.post,
                    url,
                    json={"model": MODEL, "messages": ASK, "max_tokens": POISON, "ignore_eos": True},
                    headers=server.auth("free"),
                    timeout=RECOVERY_TIMEOUT_S,
                )
                wait_until(
                    lambda: len(engines.kills) == 1 and dispatcher.queue_depth() == 1,
                    RECOVERY_TIMEOUT_S,
                    "the request sent back, waiting for the new child",
                )
                beside = pool.submit(
                    httpx.post,
                    url,
                    json={"model": MODEL, "messages": ASK, "max_tokens": HELD, "ignore_eos": True},
                    headers=server.auth("paid"),
                    timeout=RECOVERY_TIMEOUT_S,
                )
                wait_until(lambda: dispatcher.queue_depth() == 2, RECOVERY_TIMEOUT_S, "the second waiter")
                gate.set()
                failed, answered = poison.result(), beside.result()
        assert len(engines.kills) == 2
        assert engines.holds == engines.kills[1:]  # the second child held it when it died
        assert failed.status_code == 502, failed.text
        assert failed.headers["x-should-retry"] == "false"
        assert answered.status_code == 200, answered.text
        assert answered.json()["usage"]["completion_tokens"] == HELD
    finally:
        gate.set()


def test_a_request_that_hangs_the_engine_is_not_sent_back_to_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stuck child is killed after stall_timeout_s (120 s) and replaced as a crashed one, but
    judged by when it was killed, past the minute (_STABLE_S) that makes a crash forgiven: a
    request that hangs the engine was never suspected, its 502 after the second stuck child said
    when to retry, and each retry hung a new child for another 120 s. A stuck child is now judged
    by when it fell silent: a request that hangs the engine is sent back once, as one that crashes
    it, and fails with the 502 that asks the client not to retry.

    Both clocks scaled down, in the order the defaults have (the stall longer than the window):
    the request, sent back the moment the new child serves, reaches it within the window."""
    # The window long enough for a loaded machine's hand-off of the request to the new child.
    monkeypatch.setattr(engine_process, "_STABLE_S", 8.0)
    engines = _Engines()
    with start_server(tmp_path, {"engine": {"stall_timeout_s": 10.0}}, engines.provider) as server:
        body = {"model": MODEL, "messages": ASK, "max_tokens": STALLS, "ignore_eos": True}
        hung = httpx.post(
            server.base_url + CHAT, json=body, headers=server.auth("paid"), timeout=RECOVERY_TIMEOUT_S
        )
        assert hung.status_code == 502, hung.text
        assert "retry-after" not in hung.headers
        assert hung.headers["x-should-retry"] == "false"
        assert len(engines.stalls) == 2

        # The others are served by the next child.
        answered = httpx.post(
            server.base_url + CHAT,
            json=body | {"max_tokens": 16},
            headers=server.auth("paid"),
            timeout=RECOVERY_TIMEOUT_S,
        )
        assert answered.status_code == 200, answered.text
        assert len(engines.stalls) == 2


@pytest.mark.parametrize("crashed_before", [False, True], ids=SECOND_CRASH)
def test_a_request_on_an_engine_killed_from_outside(tmp_path: Path, crashed_before: bool) -> None:
    """Killed once, from outside (the OOM killer), while a request was on it before its first
    token: at a first crash the request waits for the new child and is answered; at a crash within
    a minute of another it cannot be told from a request that killed it, and fails (as every
    request on a crashed engine did before the engine's restarts were waited for), with a 502 that
    asks the client not to retry."""
    engines = _Engines(dies_on=1)
    with start_server(tmp_path, None, engines.provider) as server:
        if crashed_before:
            _crash_first(server, engines)
        body = {"model": MODEL, "messages": ASK, "max_tokens": POISON, "ignore_eos": True}
        sent = httpx.post(
            server.base_url + CHAT, json=body, headers=server.auth("paid"), timeout=RECOVERY_TIMEOUT_S
        )
    assert len(engines.kills) == 1
    if crashed_before:
        assert sent.status_code == 502, sent.text
        assert sent.headers["x-should-retry"] == "false"
    else:
        assert sent.status_code == 200, sent.text
        assert sent.json()["usage"]["completion_tokens"] == POISON


ONE_REQUEST = {"tiers": {"paid": ROOMY_TIERS["paid"] | {"requests_per_window": 1, "request_window_s": 3600}}}


@pytest.mark.parametrize("how", ["cancel", "disconnect"])
def test_a_request_that_met_the_crash_and_ends_while_waiting_for_the_restart_costs_nothing(
    tmp_path: Path, how: str
) -> None:
    """Its first attempt failed before its first token; waiting for the new child it is a queued
    request, which a cancel or a disconnect leaves uncharged. It was charged a request and its
    prompt, as if it had been answered."""
    gate = threading.Event()
    engines = _Engines(dies_on=1, restart_gate=gate)
    try:
        with start_server(tmp_path, ONE_REQUEST, engines.provider) as server:
            dispatcher = server.app.state.runtime.pipeline.dispatcher
            registry = server.app.state.runtime.registry
            auth = server.auth("paid")
            body = {"model": MODEL, "messages": ASK, "max_tokens": POISON, "ignore_eos": True, "stream": True}
            with httpx.stream("POST", server.base_url + CHAT, json=body, headers=auth, timeout=30.0) as sent:
                stream = events(sent)
                request_id = next(stream)["id"]
                # A first crash: the request waits for the new child, which the gate holds back.
                wait_until(
                    lambda: len(engines.kills) == 1 and dispatcher.queue_depth() == 1,
                    RECOVERY_TIMEOUT_S,
                    "the request waiting for the restart",
                )
                if how == "cancel":
                    cancel = httpx.post(
                        f"{server.base_url}{CHAT}/{request_id}/cancel", headers=auth, timeout=30.0
                    )
                    assert cancel.status_code == 200, cancel.text
                    assert list(stream)[-1] == DONE
            wait_until(lambda: len(registry) == 0, RECOVERY_TIMEOUT_S, "the request's end")
            gate.set()
            # The tier's one request is still there.
            answered = httpx.post(
                server.base_url + CHAT,
                json=body | {"stream": False, "max_tokens": 4},
                headers=auth,
                timeout=RECOVERY_TIMEOUT_S,
            )
            assert answered.status_code == 200, answered.text
            assert answered.headers["x-ratelimit-remaining-requests"] == "0"
    finally:
        gate.set()


def test_a_replacement_that_dies_before_its_model_is_sent_is_tried_again(tmp_path: Path) -> None:
    """The new child killed before the engine process wrote it the model to load (the OOM killer
    at its start, or a parent thread that waited for a core meanwhile): the write's EPIPE escaped
    the restart as OSError and ended the reader thread, so no child was started again, and every
    request waited for a replica said to be back in 0 s until it timed out. Now it is a failed
    start like any other: the next restart serves."""
    engines = _Engines()
    with start_server(tmp_path, None, engines.provider) as server:
        (process,) = engines.started
        spawn_child = process._popen
        stillborn: list[int] = []

        def dead_on_arrival(blas_threads: int) -> tuple[Any, int, int]:
            child, commands, events_ = spawn_child(blas_threads)
            if not stillborn:
                child.kill()
                child.wait()
                stillborn.append(child.pid)
            return child, commands, events_

        process._popen = dead_on_arrival  # type: ignore[method-assign]
        doomed = process.pid
        assert doomed is not None
        os.kill(doomed, signal.SIGKILL)
        wait_until(lambda: process.restarts == 1, RECOVERY_TIMEOUT_S, "a child that serves again")
        assert stillborn
        # The failed start left the replica down, not coming back: the edge's next poll finds it up.
        wait_until(
            lambda: httpx.get(server.base_url + "/readyz").status_code == 200,
            RECOVERY_TIMEOUT_S,
            "the edge ready again",
        )
        answered = httpx.post(
            server.base_url + CHAT,
            json={"model": MODEL, "messages": ASK, "max_tokens": 4},
            headers=server.auth("paid"),
            timeout=RECOVERY_TIMEOUT_S,
        )
        assert answered.status_code == 200, answered.text
        assert process.pid not in (doomed, *stillborn)


def test_a_stuck_engine_process_is_killed_and_replaced(tmp_path: Path) -> None:
    """The child stopped mid-stream (as a step that never returns, a deadlock in BLAS): its stream
    got nothing more, for good, with no error, and the replica, ready to every health check, took
    new requests that hung too. Now a child that holds requests and sends nothing for
    `stall_timeout_s` is killed and replaced as a crashed one: the stream ends with an error event
    and [DONE], and the next request is answered by the new child."""
    before = _engine_children()
    with start_server(tmp_path, {"engine": {"stall_timeout_s": 1.0}}) as server:
        (stuck,) = _engine_children() - before
        _cut_mid_stream(server, lambda: _stop(stuck), RECOVERY_TIMEOUT_S)
        assert _dead(stuck)
        _served_by_a_new_child(server, before, stuck)


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def _children(pid: int) -> set[int]:
    found = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            found |= {int(child) for child in (task / "children").read_text().split()}
        except (FileNotFoundError, ProcessLookupError):
            continue  # a thread that ended meanwhile
    return found


@pytest.mark.server  # runs `floodgate serve` itself, through subprocess
def test_an_engine_stopped_with_its_edge_is_not_taken_for_stuck(tmp_path: Path) -> None:
    """`floodgate serve` stopped whole (Ctrl-Z in its terminal, a frozen container: the edge and its
    engine child, one process group) for longer than stall_timeout_s, then continued: the edge's
    clock ran while neither could run, and its reader, woken first, killed the engine at once as
    stuck, failing a stream it was serving. Its silence was the edge's own: the stream goes on."""
    stall_s, max_tokens = 0.5, 1500
    port = free_port()
    config = tmp_path / "floodgate.toml"
    config.write_text(
        f'[model]\nsource = "demo"\nname = "{MODEL}"\ndemo_dir = "{demo_model_dir()}"\n'
        f'[messages]\nsqlite_path = "{tmp_path / "messages.db"}"\n'
        f"[engine]\nstall_timeout_s = {stall_s}\n"
        f'[server]\nkeys_file = "{tmp_path / "keys.jsonl"}"\nops_port = 0\n'
        "drain_accept_s = 0.0\ndrain_deadline_s = 0.0\n"
    )
    command = [sys.executable, "-m", "edge.cli", "serve", "--config", str(config), "--port", str(port)]
    # This checkout's edge, wherever the environment's editable install points.
    env = os.environ | {"PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.Popen(
        command,
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline() for _ in range(4)]
        key = re.search(r"(fg-\S+)", lines[1])
        assert key, lines
        threading.Thread(target=proc.stdout.read, daemon=True).start()  # its logs never fill the pipe
        body = {
            "model": MODEL,
            "messages": LONG_PROMPT,
            "stream": True,
            "ignore_eos": True,
            "max_tokens": max_tokens,
            "stream_options": {"include_usage": True},
        }
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=RECOVERY_TIMEOUT_S) as client:
            wait_until(lambda: _ready(client), RECOVERY_TIMEOUT_S)
            (engine,) = _children(proc.pid)
            headers = {"Authorization": f"Bearer {key.group(1)}"}
            with client.stream("POST", CHAT, json=body, headers=headers) as open_stream:
                stream = events(open_stream)
                while not content_of([next(stream)]):
                    pass
                os.killpg(proc.pid, signal.SIGSTOP)
                wait_until(lambda: _state(proc.pid) in "Tt" and _state(engine) in "Tt", RECOVERY_TIMEOUT_S)
                time.sleep(4 * stall_s)  # the stop's length, past the stall timeout: the scenario itself
                os.killpg(proc.pid, signal.SIGCONT)
                rest = list(stream)
        assert not [e for e in rest if isinstance(e, dict) and "error" in e], rest[-3:]
        assert rest[-1] == DONE
        assert rest[-2]["usage"]["completion_tokens"] == max_tokens
        assert not _dead(engine) and _children(proc.pid) == {engine}
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGCONT)
        proc.terminate()
        proc.wait(timeout=30)


def _ready(client: httpx.Client) -> bool:
    try:
        return client.get("/readyz").status_code == 200
    except httpx.TransportError:
        return False
