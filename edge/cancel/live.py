"""One request in flight, as the cancel machinery sees it."""

from __future__ import annotations

import anyio

from edge.cancel.scope import cancel_scope


class LiveRequest:
    """A request in flight. Its generation runs inside `scope()`; `cancel` stops it there.

    The contract between a cancel and a generation that ends on its own: whichever of `cancel()`
    and `end()` comes first decides (across instances the store decides the same way,
    edge/cancel/bus.py). A cancel before
    `end()` answers CANCELLED and the outcome is cancelled (even if the last token was already
    out: the final chunk carries `"floodgate": {"cancelled": true}`); a cancel after it answers
    FINISHED (409), and the outcome is what the generation said, unless a cancel came first: then
    it answers CANCELLED again, as OpenAI's cancel of a cancelled response returns it as it is
    (idempotent). Both run on the event loop's thread, so neither can slip between the other's
    check and mark.
    """

    __slots__ = ("_scope", "cancelled", "ended", "owner", "request_id")

    def __init__(self, request_id: str, owner: str) -> None:
        self.request_id = request_id
        self.owner = owner
        self.cancelled = False
        self.ended = False
        self._scope: anyio.CancelScope | None = None

    def scope(self) -> anyio.CancelScope:
        """The cancel scope to run the generation in (cancelled at once if a cancel came first)."""
        if self._scope is None:
            self._scope = cancel_scope()
            if self.cancelled:
                self._scope.cancel()
        return self._scope

    def cancel(self) -> bool:
        """Stop the generation; whether it ends (or ended) cancelled. False when it had already
        ended on its own: the cancel changes nothing. A cancel repeated after one that came first
        answers True as that one did, so the client's retry of a cancel is not told "finished"."""
        if self.ended:
            return self.cancelled
        self.cancelled = True
        if self._scope is not None:
            self._scope.cancel()
        return True

    def cancelled_elsewhere(self) -> None:
        """The store says a cancel another instance answered came first (its settle's answer, after
        `end()`): that one answered CANCELLED, so a cancel repeated here must too, not FINISHED."""
        self.cancelled = True

    def end(self) -> bool:
        """The generation stopped running: its outcome is decided now. True when a cancel came
        first, and the outcome must then be reported as cancelled."""
        self.ended = True
        return self.cancelled
