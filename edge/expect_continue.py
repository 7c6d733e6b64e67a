"""A request that sent `Expect: 100-continue` and was answered before it was told to send its body.

uvicorn writes "100 Continue" at the app's first read of the body, so a request the edge refuses
from its headers alone (a bad key's 401, a Content-Length past the limit's 413) is answered with no
100, as RFC 9110 10.1.1 allows. But the answer said nothing of the connection, which stayed open
for a body the client had been told nothing about: a client that sent it none and reused the
connection had its next request read as the refused one's body, and met no answer, then a close at
the header deadline (30 s). As nginx and h11 do, such an answer now says `connection: close`, and
the connection closes after it (edge/http_protocol.py). A client that sent its body whole along
with the headers (not waiting) has nothing unread: its connection is kept.
"""

from __future__ import annotations

from uvicorn._types import ASGISendEvent
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle


class ExpectingCycle(RequestResponseCycle):
    """An HTTP/1.1 request's cycle that asked for 100 Continue (the protocol gives it this class
    once uvicorn has built it, as UntilCloseCycle)."""

    # Answered with the body unsent and unasked for: the answer said `connection: close`, and the
    # protocol closes the connection once it is written.
    body_refused = False

    async def send(self, message: ASGISendEvent) -> None:
        if (
            not self.response_started
            and message["type"] == "http.response.start"
            and self.waiting_for_100_continue
            and self.more_body
        ):
            self.body_refused = True
            self.keep_alive = False  # uvicorn adds `connection: close`, once
            await super().send(message)
            # uvicorn would close the moment the answer ends, and a close with the client's body
            # bytes still unread sends a reset, which can reach the client before the answer and
            # destroy it: the protocol closes it a moment later, its further bytes dropped.
            self.keep_alive = True
            return
        await super().send(message)
