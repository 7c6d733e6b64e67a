"""Engine outputs on their way to the response senders, merged per request.

The engine thread only posts (no I/O); a sender thread takes everything pending and sends it. A
request whose previous response is still being sent gets its next steps' tokens in one response,
so a slow send path costs fewer, larger responses rather than engine steps.
"""

from __future__ import annotations

import threading

from gpu_container.engine.types import TokenOutput


class Outbox:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        # Insertion-ordered: requests are served in the order their outputs first arrived.
        self._pending: dict[str, TokenOutput] = {}
        self._closed = False

    def post(self, out: TokenOutput) -> None:
        with self._cond:
            held = self._pending.get(out.request_id)
            if held is None:
                self._pending[out.request_id] = TokenOutput(
                    out.request_id, list(out.token_ids), out.finish_reason, out.error
                )
            else:
                held.token_ids.extend(out.token_ids)
                held.finish_reason = out.finish_reason or held.finish_reason
                held.error = out.error or held.error
            self._cond.notify()

    def take(self) -> list[TokenOutput] | None:
        """Everything pending, waiting while there is nothing; None once closed and drained."""
        with self._cond:
            while not self._pending and not self._closed:
                self._cond.wait()
            if not self._pending:
                return None
            batch = list(self._pending.values())
            self._pending = {}
            return batch

    def close(self) -> None:
        """No more posts; take() returns what is left, then None."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
