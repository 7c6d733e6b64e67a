"""The HTTP/1.1 protocol the edge's uvicorn runs: uvicorn's httptools one, with a response's head
written with its first body bytes (edge/header_write.py) and a stream's token chunks written
without the ASGI send when nothing makes them wait (edge/body_chunks.py)."""

from __future__ import annotations

import asyncio

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from edge.body_chunks import WRITE_NOW, BodyChunkWriter
from edge.header_write import HeadHoldingTransport


class EdgeHttpProtocol(HttpToolsProtocol):
    """`uvicorn.Config(http=EdgeHttpProtocol)`."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(HeadHoldingTransport(transport, self.loop))  # type: ignore[arg-type]

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        cycle = self.cycle
        # Not on an upgrade (no new cycle for this scope): the writer belongs to this request's cycle.
        if cycle is not None and cycle.scope is self.scope:
            self.scope[WRITE_NOW] = BodyChunkWriter(cycle).write_now  # type: ignore[literal-required]
