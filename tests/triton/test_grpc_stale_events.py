"""The suite's filter for grpc.aio's stale completions (tests/support/grpc_stale_events.py) drops
exactly grpc's reader callback failing on a closed loop, and no other error of a test's loop."""

from __future__ import annotations

import asyncio

from anyio._backends import _asyncio as anyio_asyncio


class PollerCompletionQueue:
    """Named as grpc's Cython class is, so a handle on its reader reads as grpc's does."""

    def _handle_events(self) -> None: ...


def _report(
    runner: anyio_asyncio.TestRunner, error: Exception, handle: asyncio.Handle
) -> list[BaseException]:
    loop = runner.get_loop()
    loop.call_exception_handler({"message": "Exception in callback", "exception": error, "handle": handle})
    reported, runner._exceptions = list(runner._exceptions), []
    return reported


def test_only_grpcs_closed_loop_error_is_dropped() -> None:
    with anyio_asyncio.TestRunner() as runner:
        loop = runner.get_loop()
        grpc_reader = asyncio.Handle(PollerCompletionQueue()._handle_events, (), loop)
        other = asyncio.Handle(print, (), loop)
        closed = RuntimeError("Event loop is closed")
        assert _report(runner, closed, grpc_reader) == []
        assert _report(runner, closed, other) == [closed]
        wrong = RuntimeError("something else")
        assert _report(runner, wrong, grpc_reader) == [wrong]
