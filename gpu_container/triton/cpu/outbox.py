"""Engine outputs on their way to the response senders, merged per request, first tokens first.

The engine thread only posts (no I/O); a sender thread takes what is pending and sends it, each
send one IPC round trip to the server. Outputs posted for a request still waiting to be taken merge
into one response, and what is posted while a batch is being sent waits for the next batch: a slow
send path costs fewer, larger responses rather than engine steps. A request that has had no
response yet goes first, even before the rest of a batch being sent (`take_first`): its time to
first token waits on no other stream's later tokens.
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
                    out.request_id, list(out.token_ids), out.finish_reason, out.error, out.cached_tokens
                )
            else:
                held.token_ids.extend(out.token_ids)
                # Set on the first output only: merged outputs add up to the request's figure.
                held.cached_tokens += out.cached_tokens
                held.finish_reason = out.finish_reason or held.finish_reason
                held.error = out.error or held.error
            self._cond.notify()

    def take(self) -> list[TokenOutput] | None:
        """Every first output pending, else every other output pending (waiting while there is
        none); None once closed and drained."""
        with self._cond:
            while not (self._fresh or self._pending or self._closed):
                self._cond.wait()
            return self._pop(self._fresh) if self._fresh else (self._pop(self._pending) or None)

    def take_first(self) -> list[TokenOutput]:
        """Every first output pending, without waiting: what goes before the rest of a batch."""
        with self._cond:
            return self._pop(self._fresh)

    def _pop(self, queue: dict[str, TokenOutput]) -> list[TokenOutput]:
        batch = list(queue.values())
        queue.clear()
        for out in batch:
            if out.finish_reason is None:
                self._started.add(out.request_id)
            else:
                self._started.discard(out.request_id)
        return batch

    def close(self) -> None:
        """No more posts; take() returns what is left, then None."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
