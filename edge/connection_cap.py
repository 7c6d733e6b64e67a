"""A connection past the process's capacity: answered 503 `server_busy` with Retry-After and closed,
never accepted and dropped unanswered.

Every connection holds a file descriptor from its accept, idle or waiting for its headers, and the
stream gate (edge/stream_gate.py) counts only streams. Out of descriptors, the event loop (libuv)
accepts each new client and closes it at once: the client read nothing (its SDK a connection
error, a load balancer a 502), and the edge wrote no line and counted nothing (1,400 idle
connections held on an edge limited to 1,400 descriptors: none of 3,000 more got an answer). So the
public listener holds at most the connections the open-file limit leaves room for (edge/open_files.py
connection_cap). At it, the oldest idle connection is closed for the new one (edge/idle_connections.py);
where every connection is busy, the protocol (edge/http_protocol.py) answers the new one at once,
before reading anything, with bytes built once for the server (`busy_answer`): no request has been
read, so there is no request id, and the answer is the same for every one. The OpenAI SDK retries a
503 after its Retry-After; a load balancer passes it on, and takes the retry elsewhere.

Under a flood this runs for every new connection, so it is cheap and says little: counted in
floodgate_connections_turned_away_total, and logged at most once a second (`connections_turned_away`,
with how many since the line before), never a line per connection.

The answer's connection lingers (`TurnedAway.linger`): its end is sent after the answer and what
the client sends is read and dropped until it closes its end (one round trip), or for LINGER_S at
most. Closed with the client's request still unread, the socket sends a reset, which can reach the
client before the answer and destroy it, or meet its request's write. A lingering connection holds
its descriptor, out of the reserve (edge/open_files.py RESERVED_FDS): at most MAX_LINGERING of them
at once, and past that one is closed with its answer at once (a reset where its request came first).
"""

from __future__ import annotations

import structlog

from edge.errors import closing_error_response, retry_after_headers
from edge.metrics import CONNECTIONS_TURNED_AWAY
from edge.open_files import RESERVED_FDS
from edge.stream_gate import BUSY_RETRY_AFTER_S

log = structlog.get_logger("floodgate.connections")

# How long a turned-away connection waits for its client to close, its bytes dropped.
LINGER_S = 1.0
# Turned-away connections lingering at once, at most: a quarter of the descriptor reserve.
MAX_LINGERING = RESERVED_FDS // 4
# The most often a `connections_turned_away` line is written.
LOG_EVERY_S = 1.0


def busy_answer(cors_lines: bytes) -> bytes:
    """The whole answer, with the CORS header lines for a request whose Origin is not known yet
    (edge/cors.py refusal_lines): a page calling the API reads the 503 too."""
    retry_after = b"".join(
        b"%s: %s\r\n" % (name.encode(), value.encode())
        for name, value in retry_after_headers(BUSY_RETRY_AFTER_S).items()
    )
    return closing_error_response(
        b"503 Service Unavailable",
        "This server holds as many connections as it can. Please try again shortly.",
        "server_busy",
        type="service_unavailable",
        header_lines=retry_after + cors_lines,
    )


class TurnedAway:
    """The process's count of connections turned away, its log line's pace, and how many of them
    linger now (one for every listener: the descriptors are the process's)."""

    __slots__ = ("_next_line_at", "_unlogged", "lingering")

    def __init__(self) -> None:
        self._next_line_at = 0.0
        self._unlogged = 0
        self.lingering = 0

    def note(self, now: float, open_connections: int, max_connections: int) -> None:
        """One more turned away (`now`: the loop's clock); a line if the last was LOG_EVERY_S ago.
        The first of a burst is logged at once, the rest in the next line, a second later at the
        earliest (the counter has them all meanwhile)."""
        CONNECTIONS_TURNED_AWAY.inc()
        self._unlogged += 1
        if now < self._next_line_at:
            return
        log.warning(
            "connections_turned_away",
            turned_away=self._unlogged,
            open_connections=open_connections,
            max_connections=max_connections,
        )
        self._unlogged = 0
        self._next_line_at = now + LOG_EVERY_S

    def linger(self) -> bool:
        """Whether one more may linger (counted, until `lingered`) rather than close at once."""
        if self.lingering >= MAX_LINGERING:
            return False
        self.lingering += 1
        return True

    def lingered(self) -> None:
        self.lingering -= 1


TURNED_AWAY = TurnedAway()
