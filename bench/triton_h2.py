"""One more Triton client measured for issue 11: one gRPC stream per replica over HTTP/2 read by hand.

The edge reads Triton's HTTP `generate_stream`, one connection per open stream (edge/upstreams/
triton_sse.py): every token is a read(2) of its own and a wake-up of the loop for its connection,
which with one step clock for all streams puts the Triton path's floor 1.6x the in-process one
(docs/bench-triton.md). A single stream carrying every request (TensorRT-LLM's decoupled model
takes many requests on one ModelStreamInfer stream, each response tagged with its request id) could
bring many tokens in one read, but grpc.aio and the synchronous client spend their per-message
machinery on each token (bench/triton_shared_stream.py: 2.9-3.6x the edge's client at 64 streams).

This is that one stream without grpc's machinery: an asyncio Protocol speaking HTTP/2 itself
(frames split by hand, `hpack` only for the header blocks), every gRPC message parsed with the
protobuf runtime and handed to its request's Inbox in the same callback. Windows are opened wide
once (2^31 - 1) and topped up after a gigabyte, pings and settings answered. A prototype for the
bench, not the edge: no TLS, no GOAWAY draining (every request fails as on a lost connection), one
connection per replica. `bench.triton_clients --clients sse,h2-shared` puts it beside the edge's.
"""

from __future__ import annotations

import asyncio
import itertools
import struct
from array import array
from typing import Any, cast

import hpack
from tritonclient.grpc import service_pb2

from bench.triton_shared_stream import Inbox, deliver, response_item
from edge.upstreams.base import UpstreamError

_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_DATA, _HEADERS, _RST_STREAM, _SETTINGS = 0, 1, 3, 4
_PING, _GOAWAY, _WINDOW_UPDATE, _CONTINUATION = 6, 7, 8, 9
_END_STREAM, _ACK, _END_HEADERS, _PADDED, _PRIORITY = 0x1, 0x1, 0x4, 0x8, 0x20
_STREAM = 1  # the one stream this connection carries
_MAX_WINDOW = 2**31 - 1
_TOP_UP_AFTER = 2**30  # bytes read before the windows are opened again
_SETTINGS_INITIAL_WINDOW_SIZE, _SETTINGS_MAX_FRAME_SIZE, _SETTINGS_ENABLE_PUSH = 0x4, 0x5, 0x2
_PATH = "/inference.GRPCInferenceService/ModelStreamInfer"
_FINAL = "triton_final_response"
# A frame's 9-byte head read as (length << 8 | type, flags, stream id with its reserved bit).
_HEAD = struct.Struct(">IBI")


def _tokens(response: Any) -> tuple[list[int], bool]:
    """(new token ids of beam 0, is this the request's final response), without numpy: two
    np.frombuffer calls were a quarter of this client's CPU per message."""
    ids: list[int] = []
    length = -1
    for out, raw in zip(response.outputs, response.raw_output_contents, strict=False):
        if out.name == "output_ids":
            values = array("i")
            values.frombytes(raw)
            ids = values.tolist()
        elif out.name == "sequence_length":
            length = int.from_bytes(raw[:4], "little", signed=True)
    if 0 <= length < len(ids):
        del ids[length:]
    params = response.parameters
    return ids, _FINAL in params and params[_FINAL].bool_param


def _frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return len(payload).to_bytes(3, "big") + bytes((kind, flags)) + stream.to_bytes(4, "big") + payload


class H2SharedStream(asyncio.Protocol):
    """The one ModelStreamInfer stream to a replica (host:port), with the AioSharedStream's face."""

    def __init__(self, name: str, address: str, loop: asyncio.AbstractEventLoop) -> None:
        self._name = name
        self._loop = loop
        self._host, port = address.rsplit(":", 1)
        self._inboxes: dict[str, Inbox] = {}
        self._suffixes = itertools.count(1)
        self.failed: BaseException | None = None
        self._transport: asyncio.Transport | None = None
        self._pending: list[bytes] = []  # written before the connection is up, or past the window
        # The server's windows for our DATA (RFC 9113 6.9): the connection's and the stream's.
        self._connection_window = 65_535
        self._stream_window = 65_535
        self._initial_window = 65_535
        self._inbuf = bytearray()
        self._grpc = bytearray()  # the stream's DATA payloads not yet split into messages
        self._header_block = bytearray()
        self._header_end_stream = False
        self._decoder = hpack.Decoder()
        self._read_since_top_up = 0
        # What a read brings: messages per read(2) tell whether responses share reads at all.
        self.reads = 0
        self.messages = 0
        self._connecting = loop.create_task(self._connect(int(port)))

    async def _connect(self, port: int) -> None:
        try:
            await self._loop.create_connection(lambda: self, self._host, port)
        except OSError as exc:
            self._fail(UpstreamError(f"{self._name}: {exc}"))

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    @property
    def alive(self) -> bool:
        return self.failed is None

    # The stream's face (bench/triton_shared_stream.py: SharedStreamUpstream).

    def submit(self, request: Any) -> Inbox:
        if request.id in self._inboxes:
            request.id = f"{request.id}.{next(self._suffixes)}"
        inbox = Inbox(request.id, self._loop)
        if self.failed is not None:
            inbox.put(self.failed)
            return inbox
        self._inboxes[request.id] = inbox
        self._send_message(request.SerializeToString())
        return inbox

    def stop(self, inbox: Inbox, stop_request: Any) -> None:
        if self._inboxes.pop(inbox.wire_id, None) is not None and self.alive:
            self._send_message(stop_request.SerializeToString())

    def close(self) -> None:
        self._fail(UpstreamError(f"{self._name}: stream closed"))
        if self._transport is not None:
            self._transport.close()
        self._connecting.cancel()

    # The connection.

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses: no isinstance check.
        self._transport = transport = cast(asyncio.Transport, transport)
        settings = struct.pack(
            ">HIHIHI",
            _SETTINGS_ENABLE_PUSH,
            0,
            _SETTINGS_INITIAL_WINDOW_SIZE,
            _MAX_WINDOW,
            _SETTINGS_MAX_FRAME_SIZE,
            2**20,
        )
        headers = hpack.Encoder().encode(
            [
                (":method", "POST"),
                (":scheme", "http"),
                (":path", _PATH),
                (":authority", self._host),
                ("content-type", "application/grpc"),
                ("te", "trailers"),
            ]
        )
        transport.write(
            _PREFACE
            + _frame(_SETTINGS, 0, 0, settings)
            + _frame(_WINDOW_UPDATE, 0, 0, (_MAX_WINDOW - 65_535).to_bytes(4, "big"))
            + _frame(_HEADERS, _END_HEADERS, _STREAM, headers)
        )
        self._flush()

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(UpstreamError(f"{self._name}: connection lost ({exc!r})"))

    def data_received(self, data: bytes) -> None:
        self.reads += 1
        buf = self._inbuf
        buf += data
        at, end = 0, len(buf)
        while end - at >= 9:
            word, flags, stream = _HEAD.unpack_from(buf, at)
            length, kind, stream = word >> 8, word & 0xFF, stream & _MAX_WINDOW
            if end - at - 9 < length:
                break
            start = at + 9
            at = start + length
            if kind == _DATA:
                self._on_data(buf, start, at, flags)
            elif kind in (_HEADERS, _CONTINUATION):
                self._on_headers(bytes(buf[start:at]), kind, flags)
            elif kind == _SETTINGS:
                if not flags & _ACK:
                    self._on_settings(bytes(buf[start:at]))
            elif kind == _WINDOW_UPDATE:
                increment = int.from_bytes(buf[start:at], "big") & _MAX_WINDOW
                if stream == 0:
                    self._connection_window += increment
                elif stream == _STREAM:
                    self._stream_window += increment
                self._flush()
            elif kind == _PING:
                if not flags & _ACK and self._transport is not None:
                    self._transport.write(_frame(_PING, _ACK, 0, bytes(buf[start:at])))
            elif (kind == _RST_STREAM and stream == _STREAM) or kind == _GOAWAY:
                self._fail(UpstreamError(f"{self._name}: stream reset (frame type {kind})"))
        del buf[:at]
        self._split_messages()

    def _on_data(self, buf: bytearray, start: int, end: int, flags: int) -> None:
        self._read_since_top_up += end - start
        if flags & _PADDED:
            pad = buf[start]
            start, end = start + 1, end - pad
        self._grpc += buf[start:end]
        if flags & _END_STREAM:
            self._fail(UpstreamError(f"{self._name}: stream ended"))
        if self._read_since_top_up >= _TOP_UP_AFTER and self._transport is not None:
            increment = self._read_since_top_up.to_bytes(4, "big")
            self._read_since_top_up = 0
            self._transport.write(
                _frame(_WINDOW_UPDATE, 0, 0, increment) + _frame(_WINDOW_UPDATE, 0, _STREAM, increment)
            )

    def _split_messages(self) -> None:
        g = self._grpc
        at, end = 0, len(g)
        inboxes = self._inboxes
        parse = service_pb2.ModelStreamInferResponse.FromString
        while end - at >= 5:
            length = int.from_bytes(g[at + 1 : at + 5], "big")
            if end - at - 5 < length:
                break
            message = parse(bytes(g[at + 5 : at + 5 + length]))
            at += 5 + length
            self.messages += 1
            deliver(inboxes, *response_item(self._name, message, _tokens))
        if at:
            del g[:at]

    def _on_headers(self, block: bytes, kind: int, flags: int) -> None:
        if kind == _HEADERS:
            if flags & _PADDED:
                block = block[1 : len(block) - block[0]]
            if flags & _PRIORITY:
                block = block[5:]
            self._header_block = bytearray(block)
            self._header_end_stream = bool(flags & _END_STREAM)
        else:
            self._header_block += block
        if not flags & _END_HEADERS:
            return
        # Decoded as text (raw=False), whatever hpack's annotations say.
        headers = cast(dict[str, str], dict(self._decoder.decode(bytes(self._header_block))))
        status = headers.get("grpc-status")
        if self._header_end_stream or (status is not None and status != "0"):
            message = headers.get("grpc-message", "")
            self._fail(UpstreamError(f"{self._name}: grpc-status {status} {message}".rstrip()))

    def _on_settings(self, payload: bytes) -> None:
        for i in range(0, len(payload) - 5, 6):
            ident, value = struct.unpack_from(">HI", payload, i)
            if ident == _SETTINGS_INITIAL_WINDOW_SIZE:
                # An open stream's window moves by the difference (RFC 9113 6.9.2).
                self._stream_window += value - self._initial_window
                self._initial_window = value
        if self._transport is not None:
            self._transport.write(_frame(_SETTINGS, _ACK, 0))

    def _send_message(self, payload: bytes) -> None:
        self._pending.append(_frame(_DATA, 0, _STREAM, b"\0" + len(payload).to_bytes(4, "big") + payload))
        self._flush()

    def _flush(self) -> None:
        transport = self._transport
        if transport is None:
            return
        while self._pending and len(self._pending[0]) - 9 <= min(
            self._connection_window, self._stream_window
        ):
            frame = self._pending.pop(0)
            self._connection_window -= len(frame) - 9
            self._stream_window -= len(frame) - 9
            transport.write(frame)

    def _fail(self, error: BaseException) -> None:
        if self.failed is None:
            self.failed = error
        inboxes, self._inboxes = self._inboxes, {}
        for inbox in inboxes.values():
            inbox.put(error)
