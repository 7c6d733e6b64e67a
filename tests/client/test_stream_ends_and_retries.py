"""How a client stream ends around the server's own ends, against a scripted edge (its bytes as the
real edge writes them, tests/client/scripted_edge.py). Two faults a review showed: a cancel that came
while auto_retry waited out an in-stream refusal went out under the refused request's id, was
answered 409 ("already finished") and the retry then streamed a whole reply, billed; and a stream
that ended with an error event (its [DONE] after) still sent a cancel on the block's exit, answered
409 after up to CANCEL_ON_EXIT_S on an edge that had just failed."""

from __future__ import annotations

import json
import signal
import threading
import time

import anyio
import pytest

import floodgate_client.client as client_mod
from edge.admission.ticket import Overloaded
from edge.errors import overloaded_error, upstream_error
from edge.sse import DONE, ChunkEncoder, event
from floodgate_client import (
    AsyncClient,
    Client,
    Finished,
    FloodgateError,
    ServiceUnavailableError,
    StreamError,
    TextDelta,
)
from tests.client.scripted_edge import FINISHED, ScriptedEdge
from tests.client.test_cli import chat_cli

WAIT_S = 30.0  # the refusal's wait: the retry is never due within a test


def _overloaded(request_id: str) -> bytes:
    error = overloaded_error(Overloaded("wait_too_long", WAIT_S))
    return ChunkEncoder(request_id, "floodgate-tiny", 0).first() + event({"error": error.detail}) + DONE


def _answered(request_id: str) -> bytes:
    encoder = ChunkEncoder(request_id, "floodgate-tiny", 0)
    return encoder.first() + encoder.delta("hello") + encoder.final("stop", None) + encoder.usage(3, 1) + DONE


def _failed(request_id: str) -> bytes:
    encoder = ChunkEncoder(request_id, "floodgate-tiny", 0)
    return (
        encoder.first()
        + encoder.delta("hel")
        + encoder.usage(3, 1)
        + event({"error": upstream_error().detail})
        + DONE
    )


def test_a_cancel_while_a_retry_waits_calls_the_retry_off() -> None:
    edge = ScriptedEdge([_overloaded("chatcmpl-first"), _answered("chatcmpl-second")], cancel_answer=FINISHED)
    events: list[object] = []
    try:
        with Client(edge.base_url, "fg-test") as client:
            with client.chat.stream("hi", model="floodgate-tiny", auto_retry=True) as stream:
                reader = threading.Thread(target=lambda: events.extend(stream), daemon=True)
                reader.start()
                deadline = time.monotonic() + 10
                while not stream.retrying and time.monotonic() < deadline:
                    time.sleep(0.01)
                assert stream.retrying  # refused, waiting out the refusal
                assert stream.cancel()
                reader.join(timeout=WAIT_S + 10)
        assert edge.requests == 1 and edge.cancels == 0  # no retry, no cancel of the refused request
        # (the reader ended well before the refusal's 30 s wait: the test's own time shows it)
        assert not any(isinstance(e, TextDelta) for e in events), events
        assert isinstance(events[-1], Finished) and events[-1].cancelled
    finally:
        edge.close()


def test_an_async_cancel_while_a_retry_waits_calls_the_retry_off() -> None:
    edge = ScriptedEdge([_overloaded("chatcmpl-first"), _answered("chatcmpl-second")], cancel_answer=FINISHED)
    events: list[object] = []

    async def main() -> None:
        async with AsyncClient(edge.base_url, "fg-test") as client:
            async with client.chat.stream("hi", model="floodgate-tiny", auto_retry=True) as stream:
                async with anyio.create_task_group() as group:

                    async def read() -> None:
                        async for e in stream:
                            events.append(e)

                    group.start_soon(read)
                    with anyio.fail_after(10):
                        while not stream.retrying:  # noqa: ASYNC110 (a flag of the stream's, no event)
                            await anyio.sleep(0.01)
                    assert await stream.cancel()

    try:
        anyio.run(main)
        assert edge.requests == 1 and edge.cancels == 0
        assert not any(isinstance(e, TextDelta) for e in events), events
        assert isinstance(events[-1], Finished) and events[-1].cancelled
    finally:
        edge.close()


def test_no_cancel_is_sent_on_exit_after_an_error_event() -> None:
    edge = ScriptedEdge([_failed("chatcmpl-failed"), _failed("chatcmpl-failed-2")])
    try:
        with Client(edge.base_url, "fg-test") as client, pytest.raises(StreamError):
            client.chat.create("hi", model="floodgate-tiny")

        async def main() -> None:
            async with AsyncClient(edge.base_url, "fg-test") as aclient:
                with pytest.raises(StreamError):
                    await aclient.chat.create("hi", model="floodgate-tiny")

        anyio.run(main)
        assert edge.cancels == 0
    finally:
        edge.close()


def test_ctrl_c_while_the_cli_waits_to_retry_calls_the_retry_off() -> None:
    """`floodgate-chat --retry`: the first Ctrl-C during the wait sent a cancel of the refused
    request, answered 409 ("cancel failed"), and the retry streamed its reply anyway."""
    edge = ScriptedEdge([_overloaded("chatcmpl-first"), _answered("chatcmpl-second")], cancel_answer=FINISHED)
    try:
        # This checkout's client, as every CLI test runs it (checkout_env): os.environ ran whichever
        # checkout the venv's editable install points at.
        proc = chat_cli(edge, "hi", "--json", "--retry", "--model", "floodgate-tiny", key="fg-test")
        assert proc.stderr is not None
        for line in proc.stderr:
            if "retrying in" in line:
                break
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
        finished = json.loads(out.splitlines()[-1])
        assert finished["type"] == "finished" and finished["cancelled"] is True, (out, err)
        assert proc.returncode == 130, err
        assert "cancel failed" not in err, err
        assert edge.requests == 1 and edge.cancels == 0
    finally:
        edge.close()


def _cancel_from_another_thread(stream: object, out: list[bool]) -> None:
    t = threading.Thread(target=lambda: out.append(stream.cancel()))  # type: ignore[attr-defined]
    t.start()
    t.join()


def test_a_cancel_just_as_the_retry_goes_out_calls_it_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """A cancel from another thread as the retry is sent (the stream's retrying flag about to be
    cleared, its new decoder not yet in place) took the refused request's id, was answered 409 and
    returned False, and the retry streamed its reply (a review of the fix above)."""
    edge = ScriptedEdge([_overloaded("chatcmpl-first"), _answered("chatcmpl-second")], cancel_answer=FINISHED)
    monkeypatch.setattr(client_mod.Attempts, "pause", lambda self, s: None)  # the wait is not the point
    real = client_mod.ChunkDecoder
    made = [0]
    answers: list[bool] = []
    holder: dict[str, object] = {}

    def decoder_factory() -> client_mod.ChunkDecoder:
        made[0] += 1
        if made[0] == 2:  # the one _reopen makes: the other thread's cancel lands just before it
            _cancel_from_another_thread(holder["stream"], answers)
        return real()

    monkeypatch.setattr(client_mod, "ChunkDecoder", decoder_factory)
    try:
        with Client(edge.base_url, "fg-test") as client:
            with client.chat.stream("hi", model="floodgate-tiny", auto_retry=True) as stream:
                holder["stream"] = stream
                events = list(stream)
        assert answers == [True], (answers, edge.cancels)  # the retry was in flight: called off
        assert not any(isinstance(e, TextDelta) for e in events), events
        assert isinstance(events[-1], Finished) and events[-1].cancelled
    finally:
        edge.close()


def test_a_cancel_just_after_the_refusal_calls_the_retry_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """A cancel between the refusal and the stream's retrying flag (while its wait is worked out)
    went out under the refused id, was answered 409, and the retry streamed a billed reply."""
    edge = ScriptedEdge([_overloaded("chatcmpl-first"), _answered("chatcmpl-second")], cancel_answer=FINISHED)
    monkeypatch.setattr(client_mod.Attempts, "pause", lambda self, s: None)
    answers: list[bool] = []
    holder: dict[str, object] = {}
    real_wait = client_mod.ChatStream._overload_wait_s

    def wait_then_cancel(self: client_mod.ChatStream, error: FloodgateError) -> float | None:
        wait = real_wait(self, error)
        _cancel_from_another_thread(holder["stream"], answers)
        return wait

    monkeypatch.setattr(client_mod.ChatStream, "_overload_wait_s", wait_then_cancel)
    try:
        with Client(edge.base_url, "fg-test") as client:
            with client.chat.stream("hi", model="floodgate-tiny", auto_retry=True) as stream:
                holder["stream"] = stream
                events = list(stream)
        assert answers == [True], (answers, edge.cancels)
        assert edge.requests == 1, edge.requests
        assert not any(isinstance(e, TextDelta) for e in events), events
    finally:
        edge.close()


def test_a_cancel_right_after_the_refusal_ends_with_finished_cancelled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A cancel between the decoder's refusal and the stream's wait for it returned True (the retry
    called off), but the reader then got the refusal raised, not Finished(cancelled=True) (a
    review of the fix above)."""
    edge = ScriptedEdge([_overloaded("chatcmpl-first"), _answered("chatcmpl-second")], cancel_answer=FINISHED)
    monkeypatch.setattr(client_mod.Attempts, "pause", lambda self, s: None)
    answers: list[bool] = []
    holder: dict[str, object] = {}
    real_wait = client_mod.ChatStream._overload_wait_s

    def cancel_then_wait(self: client_mod.ChatStream, error: FloodgateError) -> float | None:
        _cancel_from_another_thread(holder["stream"], answers)
        return real_wait(self, error)

    monkeypatch.setattr(client_mod.ChatStream, "_overload_wait_s", cancel_then_wait)
    events: list[object] = []
    raised: list[BaseException] = []
    try:
        with Client(edge.base_url, "fg-test") as client:
            with client.chat.stream("hi", model="floodgate-tiny", auto_retry=True) as stream:
                holder["stream"] = stream
                try:
                    events.extend(stream)
                except FloodgateError as exc:
                    raised.append(exc)
        assert answers == [True]
        assert edge.requests == 1
        assert not raised, raised  # cancel() said True: the stream must end Finished(cancelled=True)
        assert isinstance(events[-1], Finished) and events[-1].cancelled, events
    finally:
        edge.close()


def test_a_409_for_the_refused_id_after_the_retry_finished_is_not_a_called_off_retry(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A cancel under the refused request's id whose 409 comes back only after the retry has been
    sent and streamed its whole reply returned True ("called off") though nothing was; now it asks
    again under the retry's own id, and the reply having finished, says False (a review)."""
    edge = ScriptedEdge([_overloaded("chatcmpl-first"), _answered("chatcmpl-second")], cancel_answer=FINISHED)
    monkeypatch.setattr(client_mod.Attempts, "pause", lambda self, s: None)
    answers: list[bool] = []
    holder: dict[str, object] = {}
    in_cancel = threading.Event()
    reader_done = threading.Event()
    real_wait = client_mod.ChatStream._overload_wait_s
    real_cancel = client_mod.Chat.cancel

    def slow_cancel(self: client_mod.Chat, request_id: str, **kw: object) -> str:
        in_cancel.set()
        reader_done.wait(10)  # the 409 is slow to come back
        return real_cancel(self, request_id, **kw)  # type: ignore[arg-type]

    def wait_with_cancel_out(self: client_mod.ChatStream, error: FloodgateError) -> float | None:
        wait = real_wait(self, error)
        t = threading.Thread(target=lambda: answers.append(holder["stream"].cancel()))  # type: ignore[attr-defined]
        t.start()
        holder["thread"] = t
        in_cancel.wait(10)  # its id (the refused one) is out
        return wait

    monkeypatch.setattr(client_mod.Chat, "cancel", slow_cancel)
    monkeypatch.setattr(client_mod.ChatStream, "_overload_wait_s", wait_with_cancel_out)
    events: list[object] = []
    try:
        with Client(edge.base_url, "fg-test") as client:
            with client.chat.stream("hi", model="floodgate-tiny", auto_retry=True) as stream:
                holder["stream"] = stream
                events.extend(stream)
                reader_done.set()
                holder["thread"].join(10)  # type: ignore[attr-defined]
        assert isinstance(events[-1], Finished) and not events[-1].cancelled  # the retry finished
        assert any(isinstance(e, TextDelta) for e in events)
        # cancel() said the retry was called off, yet it streamed and finished: must be False.
        assert answers == [False], answers
    finally:
        edge.close()


_BUSY = b'{"error":{"message":"slow down","type":"requests","code":"rate_limit_exceeded"}}'
# A 429 whose wait (WAIT_S) is never over within a test.
_LONG_429 = (
    b"HTTP/1.1 429 Too Many Requests\r\ncontent-type: application/json\r\n"
    + f"retry-after: {WAIT_S:.0f}\r\ncontent-length: {len(_BUSY)}\r\nconnection: close\r\n\r\n".encode()
    + _BUSY
)


def test_an_async_cancel_while_the_open_waits_out_a_429_calls_the_request_off() -> None:
    """An async stream opens in its reader's task, where auto_retry waits out a 429 before the stream
    exists: a cancel() from another task meanwhile answered False ("already finished"), and the
    retry then streamed a whole reply, billed. The sync stream has no such window: it is opened
    before the caller holds it."""
    edge = ScriptedEdge([_LONG_429, _answered("chatcmpl-second")])
    events: list[object] = []
    called_off: list[bool] = []

    async def main() -> None:
        async with AsyncClient(edge.base_url, "fg-test") as client:
            stream = client.chat.stream("hi", model="floodgate-tiny", auto_retry=True)

            async def read() -> None:
                async with stream:
                    async for e in stream:
                        events.append(e)

            with anyio.fail_after(10):  # well before the 429's wait (WAIT_S) is over
                async with anyio.create_task_group() as group:
                    group.start_soon(read)
                    while edge.requests < 1:  # noqa: ASYNC110 (the scripted edge's count)
                        await anyio.sleep(0.01)
                    called_off.append(await stream.cancel())

    try:
        anyio.run(main)
        assert called_off == [True]
        assert edge.requests == 1  # the refused request only: no retry went out
        assert events == [Finished(reason="stop", usage=None, cancelled=True)], events
    finally:
        edge.close()


def test_an_async_stream_awaited_while_its_reader_opens_it_is_sent_once() -> None:
    """`await stream` (for its headers) beside a task already reading it: both opened it, so the
    request went out twice, and one reply, never read nor closed, held a connection and ran on."""
    edge = ScriptedEdge([_answered("chatcmpl-first"), _answered("chatcmpl-second")])
    events: list[object] = []

    async def main() -> None:
        async with AsyncClient(edge.base_url, "fg-test") as client:
            stream = client.chat.stream("hi", model="floodgate-tiny")

            async def read() -> None:
                async for e in stream:
                    events.append(e)

            with anyio.fail_after(10):
                async with anyio.create_task_group() as group:
                    group.start_soon(read)
                    await stream

    try:
        anyio.run(main)
        assert edge.requests == 1
        assert isinstance(events[-1], Finished) and not events[-1].cancelled, events
    finally:
        edge.close()


def test_an_async_stream_closed_while_its_request_is_in_flight_is_never_read() -> None:
    """An async stream opens in its reader's task: a close() from another task while the request
    was out (its answer not back yet) closed nothing, and the reader then read the whole reply,
    generated and billed, from a stream closed before it opened. A closed stream is never read on:
    its reader gets NetworkError, and the answer is dropped as it comes (the disconnect stops it
    on the edge)."""
    release = threading.Event()
    edge = ScriptedEdge([_answered("chatcmpl-closed")], hold_answer=release)
    events: list[object] = []
    errors: list[FloodgateError] = []

    async def main() -> None:
        async with AsyncClient(edge.base_url, "fg-test") as client:
            stream = client.chat.stream("hi", model="floodgate-tiny")

            async def read() -> None:
                try:
                    async for e in stream:
                        events.append(e)
                except FloodgateError as error:
                    errors.append(error)

            with anyio.fail_after(10):
                async with anyio.create_task_group() as group:
                    group.start_soon(read)
                    while edge.requests < 1:  # noqa: ASYNC110 (the scripted edge's count)
                        await anyio.sleep(0.01)
                    await stream.close()
                    release.set()

    try:
        anyio.run(main)
        assert events == [], events
        assert [type(e).__name__ for e in errors] == ["NetworkError"], errors
    finally:
        release.set()
        edge.close()


_SHORT_WAIT_S = 0.1
# A 429 whose wait is over at once: auto_retry waits it out well within any deadline of a second.
_SHORT_429 = (
    b"HTTP/1.1 429 Too Many Requests\r\ncontent-type: application/json\r\n"
    + f"retry-after-ms: {_SHORT_WAIT_S * 1000:.0f}\r\ncontent-length: {len(_BUSY)}\r\n".encode()
    + b"connection: close\r\n\r\n"
    + _BUSY
)


def test_an_async_streams_retry_deadline_counts_from_its_first_attempt_not_its_making() -> None:
    """An async stream is sent when it is first opened, not when it is made; its `deadline_s` was
    counted from its making all the same. A stream made, then opened once its caller had done a
    deadline's worth of other work (a list of streams worked through in turn, a semaphore waited
    on), had its short 429 raised at once, never waited out."""
    deadline_s = 1.0
    edge = ScriptedEdge([_SHORT_429, _answered("chatcmpl-second")])
    events: list[object] = []

    async def main() -> None:
        async with AsyncClient(edge.base_url, "fg-test") as client:
            stream = client.chat.stream("hi", model="floodgate-tiny", auto_retry=True, deadline_s=deadline_s)
            # The caller's other work before it opens the stream (nothing is sent meanwhile).
            await anyio.sleep(deadline_s)
            with anyio.fail_after(10):
                async with stream:
                    events.extend([e async for e in stream])

    try:
        anyio.run(main)
        assert edge.requests == 2  # the refusal, then its retry
        assert isinstance(events[-1], Finished) and not events[-1].cancelled, events
    finally:
        edge.close()


# A 503 whose body a proxy cut: its status line and headers came whole, then the connection closed.
_CUT_503 = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 30\r\n"
    b"x-request-id: req-cut\r\ncontent-length: 200\r\nconnection: close\r\n\r\n"
    b'{"error":{"message":"the limiter st'
)


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_an_error_answer_whose_body_is_cut_raises_its_typed_error(kind: str) -> None:
    """An error answer whose body broke off as it was read (a proxy's reset, a read timeout) raised
    httpx's own RemoteProtocolError out of `stream()`, past every `except FloodgateError` (the
    CLI's: a traceback). Its status and headers came whole: it raises the error they say."""
    edge = ScriptedEdge([_CUT_503])
    caught: list[Exception] = []

    async def open_async() -> None:
        async with AsyncClient(edge.base_url, "fg-test") as client:
            try:
                await client.chat.stream("hi", model="floodgate-tiny")
            except Exception as error:  # whichever escapes: the point of the test
                caught.append(error)

    try:
        if kind == "sync":
            with Client(edge.base_url, "fg-test") as client:
                try:
                    client.chat.stream("hi", model="floodgate-tiny")
                except Exception as error:  # whichever escapes: the point of the test
                    caught.append(error)
        else:
            anyio.run(open_async)
        [error] = caught
        assert isinstance(error, ServiceUnavailableError), repr(error)
        assert error.status_code == 503 and error.retry_after_s == 30.0
        assert error.request_id == "req-cut"
    finally:
        edge.close()
