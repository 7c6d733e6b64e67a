"""A reader that was slow while its request was queued, and reads again once its reply begins, is
not cut as a stalled reader.

While the request waits for a replica the stream sends keep-alive comments; a client that reads
nothing for a while (a phone in a tunnel, less than `stalled_reader_s`) leaves one of them waiting
on the paused connection. The first token stops the keep-alive, cancelling that wait: the stream's
send-progress still said a send had been waiting since then, and with the rest of the reply
written straight to the connection (edge/body_chunks.py), the stalled-reader watch cut the stream
`stalled_reader_s` later, while its client was reading every token. On a real server whose
replica (scripted) holds the request in its prefill until the keep-alives have filled the
connection, answers a first token that carries no text (the first byte of "☃"), and then, once the
client has read everything, the rest of the reply over twice `stalled_reader_s`.
"""

from __future__ import annotations

import asyncio
import re
import socket
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from edge.upstreams.base import Delta, GenerationRequest, Upstream
from tests.edge.sse_client import MODEL, wait_until
from tests.faults.stalled_client import open_and_never_read
from tests.support.live_server import LiveServer, start_server
from tests.support.scripted_replicas import scripted_replicas

SCRIPTED = 77  # max_tokens of the request the replica below scripts
E2, B98, B83 = 161, 249, 228  # the demo tokenizer's byte pieces of "☃" (E2 98 83)
LETTER_A = 67  # "a"
# Long enough that the pause the test makes before its reader starts (keep-alives filling the
# connection, the first token, the reader's start) stays under it on a loaded machine.
STALL_S = 3.0
TOKENS = 30
GAP_S = 0.2  # TOKENS * GAP_S: twice STALL_S, past the watch's cut with the fault

_release = threading.Event()  # the connection is paused: the replica may answer its first token
_first_taken = threading.Event()  # the relay took the first token (the keep-alive is stopped)
_read_again = threading.Event()  # the client has read everything: the replica may go on


async def _wait(event: threading.Event) -> None:
    """The test's signal, from its thread (set in its `finally` whatever happens)."""
    await asyncio.to_thread(event.wait)


async def _slow_start(inner: Upstream, req: GenerationRequest) -> AsyncIterator[Delta]:
    if req.max_new_tokens == SCRIPTED:
        await _wait(_release)
        yield Delta([E2])
        _first_taken.set()  # asked for the next delta: the relay is done with the first
        await _wait(_read_again)
        yield Delta([B98, B83])
        for i in range(TOKENS):
            await asyncio.sleep(GAP_S)
            yield Delta([LETTER_A], "stop" if i == TOKENS - 1 else None)
        return
    async for delta in inner.generate(req):
        yield delta


def _paused(server: LiveServer) -> bool:
    """Some connection's writes are paused (its transport past its high-water mark)."""
    return any(c.flow.write_paused for c in server._server.server_state.connections)  # type: ignore[attr-defined]


def _stalled_cut(server: LiveServer) -> float:
    match = re.search(r"^floodgate_stalled_readers_cut_total ([0-9.e+]+)$", server.metrics_text(), re.M)
    return float(match.group(1)) if match else 0.0


def _read_all(sock: socket.socket, into: list[bytes]) -> None:
    """To the chunked body's end, or the connection's (a cut stream)."""
    while chunk := sock.recv(65536):
        into.append(chunk)
        if b"".join(into[-2:]).endswith(b"0\r\n\r\n"):
            return


def test_a_reader_slow_while_queued_is_not_cut_once_it_reads_again(tmp_path: Path) -> None:
    settings: dict[str, Any] = {
        "server": {"stalled_reader_s": STALL_S, "send_buffer_bytes": 4096, "keepalive_s": 0.0005}
    }
    for event in (_release, _first_taken, _read_again):
        event.clear()
    with start_server(tmp_path, settings, scripted_replicas(_slow_start)) as server:
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": SCRIPTED,
            "stream": True,
        }
        # The counter is the process's: other tests in this worker may have cut readers before.
        cut_before = _stalled_cut(server)
        sock = open_and_never_read(server, body)
        received: list[bytes] = []
        try:
            wait_until(lambda: _paused(server), 30, "the keep-alives to fill the connection")
            _release.set()
            assert _first_taken.wait(10)  # while the connection is still paused: nothing read yet
            reader = threading.Thread(target=_read_all, args=(sock, received), daemon=True)
            reader.start()
            wait_until(lambda: not _paused(server), 10, "the client to read the connection empty")
            # A cut before here is the watch doing its job (the pause outlasted STALL_S), not the fault.
            assert _stalled_cut(server) == cut_before, "the connection stayed paused past stalled_reader_s"
            _read_again.set()
            reader.join(30)
            assert not reader.is_alive()
        finally:
            _release.set()
            _read_again.set()
            sock.close()
        stream = b"".join(received)
        assert _stalled_cut(server) == cut_before
        assert stream.endswith(b"0\r\n\r\n")  # the chunked body ended, not dropped
        assert b"data: [DONE]" in stream
        assert stream.count(b'"content":"a"') == TOKENS
