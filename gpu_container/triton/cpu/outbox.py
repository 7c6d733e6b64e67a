"""Engine outputs on their way to the response senders, merged per request, first tokens first.

The engine thread only posts (no I/O); a sender thread takes one request's pending output at a time
and sends it, each send one IPC round trip to the server. While a request waits for its turn, its
next steps' tokens merge into the same response: a slow send path costs fewer, larger responses
rather than engine steps. A request that has had no response yet goes before every request that
has: its time to first token waits on no other stream's later tokens.
"""

from __future__ import annotations

import threading

from gpu_container.engine.types import TokenOutput


class Outbox:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        # Insertion-ordered, so each queue is served oldest first: requests with no response yet,
        # and the rest.
        self._fresh: dict[str, TokenOutput] = {}
        self._pending: dict[str, TokenOutput] = {}
        # Requests that have had a response and have not finished.
        self._started: set[str] = set()
        self._closed = False

    def post(self, out: TokenOutput) -> None:
        with self._cond:
            queue = self._pending if out.request_id in self._started else self._fresh
            held = queue.get(out.request_id)
            if held is None:
                queue[out.request_id] = TokenOutput(
                    out.request_id, list(out.token_ids), out.finish_reason, out.error
                )
            else:
                held.token_ids.extend(out.token_ids)
                held.finish_reason = out.finish_reason or held.finish_reason
                held.error = out.error or held.error
            self._cond.notify()

    def take(self) -> TokenOutput | None:
        """One request's output, waiting while there is none; None once closed and drained."""
        with self._cond:
            while not (self._fresh or self._pending or self._closed):
                self._cond.wait()
            queue = self._fresh or self._pending
            if not queue:
                return None
            request_id = next(iter(queue))
            out = queue.pop(request_id)
            if out.finish_reason is None:
                self._started.add(request_id)
            else:
                self._started.discard(request_id)
            return out

    def close(self) -> None:
        """No more posts; take() returns what is left, then None."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
