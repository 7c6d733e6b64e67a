"""An incremental Server-Sent Events parser (the WHATWG event-stream grammar).

Bytes arrive split anywhere: inside a field, between CR and LF, inside a multi-byte UTF-8 character.
Lines are cut on bytes (every line ending is ASCII), so a character is only decoded once whole.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterable, Iterable, Iterator
from dataclasses import dataclass

DONE = "[DONE]"
_BOM = b"\xef\xbb\xbf"


@dataclass(frozen=True, slots=True)
class ServerSentEvent:
    data: str
    event: str = "message"
    id: str | None = None
    retry_ms: int | None = None

    @property
    def is_done(self) -> bool:
        """The OpenAI-style end-of-stream sentinel."""
        return self.data == DONE


class SSEParser:
    """Feed bytes in any split; get back the events they complete. Comments (keep-alives) are dropped."""

    def __init__(self) -> None:
        self._pending = b""
        self._started = False
        self._data: list[str] = []
        self._event = ""
        self._last_id: str | None = None
        self._retry_ms: int | None = None

    def feed(self, chunk: bytes) -> list[ServerSentEvent]:
        buffer = self._pending + chunk
        if not self._started:
            # The BOM is only recognised whole, at the very start of the stream.
            if len(buffer) < len(_BOM) and _BOM.startswith(buffer):
                self._pending = buffer
                return []
            self._started = True
            buffer = buffer.removeprefix(_BOM)
        events: list[ServerSentEvent] = []
        start = 0
        while True:
            cr = buffer.find(b"\r", start)
            lf = buffer.find(b"\n", start)
            if cr == -1 and lf == -1:
                break
            if cr != -1 and (lf == -1 or cr < lf):
                if cr + 1 == len(buffer):
                    # A CR at the end may be the first half of CRLF: decide when more arrives.
                    break
                end, next_start = cr, cr + 2 if buffer[cr + 1] == ord("\n") else cr + 1
            else:
                end, next_start = lf, lf + 1
            event = self._line(buffer[start:end].decode("utf-8", errors="replace"))
            if event is not None:
                events.append(event)
            start = next_start
        self._pending = buffer[start:]
        return events

    def close(self) -> list[ServerSentEvent]:
        """End of stream: a line cut by a lone trailing CR still counts; an unterminated event does not."""
        if self._pending.endswith(b"\r"):
            line, self._pending = self._pending[:-1], b""
            event = self._line(line.decode("utf-8", errors="replace"))
            return [event] if event is not None else []
        return []

    def _line(self, line: str) -> ServerSentEvent | None:
        if not line:
            return self._dispatch()
        if line.startswith(":"):
            return None
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id":
            if "\0" not in value:
                self._last_id = value
        elif name == "retry":
            if value.isascii() and value.isdigit():
                self._retry_ms = int(value)
        return None

    def _dispatch(self) -> ServerSentEvent | None:
        data, event = self._data, self._event
        self._data, self._event = [], ""
        if not data:
            return None
        return ServerSentEvent(
            data="\n".join(data), event=event or "message", id=self._last_id, retry_ms=self._retry_ms
        )


def iter_events(chunks: Iterable[bytes]) -> Iterator[ServerSentEvent]:
    parser = SSEParser()
    for chunk in chunks:
        yield from parser.feed(chunk)
    yield from parser.close()


async def aiter_events(chunks: AsyncIterable[bytes]) -> AsyncGenerator[ServerSentEvent, None]:
    parser = SSEParser()
    async for chunk in chunks:
        for event in parser.feed(chunk):
            yield event
    for event in parser.close():
        yield event
