"""A test-process-only workaround for grpc.aio's stale completions on closed event loops.

grpc.aio binds one completion queue to every event loop that used it. When a loop closes while a
completion for it is still on its way (a test's loop, or a test server's, closed right after its
last stream), grpc's reader callback, running on whichever loop reads the queue next, calls
`call_soon_threadsafe` on the closed loop and raises `RuntimeError('Event loop is closed')` there:
anyio's test runner then reports it as a failure of the *next* test, which did nothing wrong
(grpc/grpc#25364 and #36096 for the same multi-loop binding). A served edge has one loop for its
whole life, so this happens only in a process that opens and closes many loops, as the suite does.

The filter drops exactly that error from that callback and passes everything else on.
"""

from __future__ import annotations

import asyncio
from typing import Any

from anyio._backends import _asyncio as anyio_asyncio

_GRPC_READER = "PollerCompletionQueue._handle_events"


def is_stale_grpc_completion(context: dict[str, Any]) -> bool:
    error = context.get("exception")
    return (
        isinstance(error, RuntimeError)
        and str(error) == "Event loop is closed"
        and _GRPC_READER in repr(context.get("handle"))
    )


def install() -> None:
    """Wrap anyio's test-runner exception handler (set on each test loop as the runner starts)."""
    runner = anyio_asyncio.TestRunner
    original = runner._exception_handler
    if getattr(original, "_skips_stale_grpc", False):
        return

    def handler(self: Any, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if not is_stale_grpc_completion(context):
            original(self, loop, context)

    handler._skips_stale_grpc = True  # type: ignore[attr-defined]
    runner._exception_handler = handler  # type: ignore[method-assign]
