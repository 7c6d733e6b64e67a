"""A stream the edge's exit cuts after some of its text ends as the drain's cut of it does: the text
it was charged for and had held back, its usage chunk, the error event, [DONE].

A plain stop (no drain), or a stream still running past the drain deadline and its grace, is
cancelled by uvicorn's shutdown (edge/streaming.py). The drain's own cut of the same stream sends the
text its stop-string matching held back and, where the client asked for it, the usage chunk before
its error event; the exit's sent the error event alone: a client billing by `usage` missed tokens it
was charged for, and the reply it kept lacked text those tokens made.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx

from edge.keys.cli_support import opened_usage
from edge.upstreams.base import Delta, GenerationRequest, Upstream
from tests.edge.sse_client import CHAT, DONE, MODEL, content_of, events
from tests.support.live_server import LiveServer, start_server
from tests.support.scripted_replicas import scripted_replicas

HANG = 7  # the max_tokens of the request the replica answers in part, then never again
REPLY = "Hello wor"  # what the replica makes of it: " wor" may begin the stop string, held back
BODY = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "hi"}],
    "max_tokens": HANG,
    "stop": ["world"],
    "stream": True,
    "stream_options": {"include_usage": True},
}


def _cut_after_text(
    tmp_path: Path, cut: Callable[[LiveServer], None], abort_s: float = 0.0
) -> tuple[list[Any], list[Any]]:
    """A stream whose replica sends REPLY's tokens, one a delta, then hangs, cut by `cut` once the
    relay has taken them all: its events after the first, and the usage rows the edge left. The
    replica takes `abort_s` to abort the sequence."""
    reached = threading.Event()
    ids: list[int] = []

    async def partial(inner: Upstream, req: GenerationRequest) -> AsyncIterator[Delta]:
        if req.max_new_tokens != HANG:
            async for delta in inner.generate(req):
                yield delta
            return
        for token in ids:
            yield Delta([token], None)
        reached.set()  # the relay asked for the next delta: it has taken every one before it
        try:
            await asyncio.Event().wait()
        finally:
            await asyncio.sleep(abort_s)

    server = start_server(tmp_path, None, scripted_replicas(partial))
    ids += server.app.state.runtime.pipeline.text.tokenizer.encode(REPLY, add_special_tokens=False).ids
    with (
        server,
        httpx.Client(base_url=server.base_url, timeout=60.0) as client,
        client.stream("POST", CHAT, json=BODY, headers=server.auth("paid")) as response,
    ):
        assert response.status_code == 200, response.read()
        stream = events(response)
        next(stream)  # the first event
        assert reached.wait(60), "the replica's tokens were never all taken"
        cut(server)
        got = list(stream)

    async def rows() -> list[Any]:
        async with opened_usage(server.settings, creates=False) as store:
            return list(await store.query("paid-user", "", ""))

    return got, asyncio.run(rows())


def _drain(server: LiveServer) -> None:
    server.drain()  # no accept window, no deadline (start_server's): the drain cuts the stream at once


def test_a_stream_the_exit_cuts_after_text_ends_as_the_drains_cut_of_it(tmp_path: Path) -> None:
    """The exit's cut sent the error event alone: no held text, no usage chunk."""
    (tmp_path / "drain").mkdir()
    (tmp_path / "exit").mkdir()
    drained, drained_rows = _cut_after_text(tmp_path / "drain", _drain)
    exited, exited_rows = _cut_after_text(tmp_path / "exit", LiveServer.stop)
    assert content_of(drained) == REPLY, drained
    assert _shape(drained)[-3:] == [("usage", 17, 3), ("error", "server_shutting_down"), DONE], drained
    # The same events, in the same order, and the same bill.
    assert _shape(exited) == _shape(drained), exited
    assert [(r.requests, r.input_tokens, r.output_tokens) for r in exited_rows] == [(1, 17, 3)]
    assert [(r.requests, r.input_tokens, r.output_tokens) for r in drained_rows] == [(1, 17, 3)]


def _shape(got: list[Any]) -> list[Any]:
    """The events as the client reads them: text, usage, error code, [DONE]."""
    shape: list[Any] = []
    for e in got:
        if e == DONE:
            shape.append(DONE)
        elif "error" in e:
            shape.append(("error", e["error"]["code"]))
        elif e.get("usage") is not None and not e["choices"]:
            shape.append(("usage", e["usage"]["prompt_tokens"], e["usage"]["completion_tokens"]))
        elif e["choices"] and e["choices"][0]["delta"].get("content"):
            shape.append(("text", e["choices"][0]["delta"]["content"]))
    return shape


def test_a_stream_the_exit_cuts_is_billed_though_its_replica_aborts_slowly(tmp_path: Path) -> None:
    """uvicorn ran the app's shutdown as soon as it had cancelled the stream: the stream, its close
    waiting on its replica's abort (a second here; a Triton behind a busy link), recorded its usage
    after the usage writer had closed (`usage_dropped`). The client's usage chunk said 17 and 3
    tokens charged; the usage store, which bills, had no row."""
    got, rows = _cut_after_text(tmp_path, LiveServer.stop, abort_s=1.0)
    assert ("usage", 17, 3) in _shape(got), got
    assert [(r.requests, r.input_tokens, r.output_tokens) for r in rows] == [(1, 17, 3)]
