"""An error answer the HTTP protocol writes itself, where no request reached the app (a request the
parser refuses, a head too large, a transfer coding it cannot decode, headers past their deadline).

Every other error answer carries an `x-request-id` and writes its `request_refused` line under it
(edge/errors.py log_refusal); these went out with neither, so a user whose every call was answered
400 had no id to quote and the operator no line to find. The bytes are built once, at import, as
before; only a refusal draws its id, counts it and logs it, so a served request pays nothing.
"""

from __future__ import annotations

from edge.errors import closing_error_response, count_refusal, log_refusal


class ClosingRefusal:
    """One kind of protocol-level refusal: its answer less the id, which each refusal adds."""

    __slots__ = ("_rest", "_status_line", "code", "status")

    def __init__(self, status_line: bytes, message: str, code: str) -> None:
        whole = closing_error_response(status_line, message, code)
        self._status_line, self._rest = whole.split(b"\r\n", 1)
        self.status = int(status_line.split(b" ", 1)[0])
        self.code = code

    def answer(self, extra_lines: bytes = b"") -> bytes:
        """Counted and logged under a refusal id of its own; the answer's bytes, that id among its
        headers, and `extra_lines` (header lines, each ending in CRLF: its CORS headers,
        edge/cors.py). Logged before it is written: a client that quotes the id finds the line
        there."""
        # Nothing of the request is known for certain here (its head was refused or never ended).
        count_refusal({}, self.status, self.code)
        named = log_refusal({}, self.status, self.code)
        return b"%s\r\nx-request-id: %s\r\n%s%s" % (
            self._status_line,
            named["x-request-id"].encode("ascii"),
            extra_lines,
            self._rest,
        )
