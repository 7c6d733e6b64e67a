"""A client that leaves while its request waits to be admitted abandons it there, at once.

A long prompt waits for an encode thread (edge/encode_queue.py) up to its tier's max wait, before
the limiter. Nothing watched its connection then: the watch began with the response
(edge/streaming.py). A client that gave up meanwhile (its read timeout, a closed tab) still had its
prompt encoded when a thread freed, for nobody, and its limiter admit taken, before the response
found it gone; under a flood of long prompts the threads worked for clients who had left while the
live ones waited behind them. Now the wait is cancelled the moment the connection goes: its prompt
is never encoded, the limiter never sees it, and it is answered (to nobody) and counted as the
edge counts a client that leaves before admission, a 499 `client_closed_request`
(`floodgate_requests_rejected_total{status="499"}`, its `request_refused` line), as a body cut
short is (edge/routes/request_body.py).

The protocol's disconnect watch (edge/disconnect_watch.py) cancels the block's scope from
`connection_lost`, the way it cancels a running generation: no task blocked in `receive()` per
waiting request, which in a flood is exactly the many requests that wait, and no reading of
`receive()` before the response, whose messages the response's own watch reads later. Under
another server (or a test's ASGI transport) there is no watch, and a waiting request ends as before.

Only the wait before the limiter is cancelled. The limiter's admit is a store call whose effect a
cancel leaves unknown (it may have landed, with no lease left to give it back); a client that
leaves during it is found at once by the response's watch, which gives the admission back whole,
as for any request cancelled while queued.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from edge.cancel.scope import cancel_scope
from edge.disconnect_watch import DisconnectWatch
from edge.errors import client_closed_request


@contextmanager
def abandoned_on_hang_up(watch: DisconnectWatch | None) -> Iterator[None]:
    """Run the block cancelled the moment the client goes (at once if it has gone), then raise the
    499. Also where it went while the block could not be cancelled (a prompt encoding on its
    thread, which runs to its end): what follows is not done for it either."""
    if watch is None:
        yield
        return
    scope = cancel_scope()
    with scope:
        watch.watch(scope)
        try:
            yield
        finally:
            watch.unwatch()
    if scope.cancel_called:
        raise client_closed_request(
            "The client closed the connection while its request waited for admission."
        )
