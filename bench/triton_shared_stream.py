"""A measured alternative Triton client that lost: one synchronous gRPC stream per replica.

Tried for issue 11 ("a cheaper Triton stream") and kept here, out of the edge, so that
`bench.triton_clients`, `bench.relay --variants triton,triton-shared` and `bench.triton_vs_local`
can rerun the comparison (docs/bench-triton.md): one grpc.aio stream per request (bench/triton_grpc.py,
the edge's client then) cost less CPU per token in the same runs; the edge now reads Triton's HTTP
`generate_stream` (edge/upstreams/triton_sse.py), which costs less than either.

How it works. The synchronous gRPC client reads every response of a replica on one thread, decodes
it there, and hands everything ready to the event loop in one call_soon_threadsafe per batch
(across all streams), as the in-process engine's mailbox does. Decoupled models accept many
requests on one stream and tag each response with its request's id. A stream shared by many
requests cannot be cancelled for one of them, so a request is cancelled with the `tensorrt_llm`
contract's `stop` input (a request with the same id and stop=true). If the stream fails, every
request on it fails with UpstreamError and the next request opens a fresh stream.

Why it lost: the synchronous client's stream is read through grpc's channel-spin thread, which
wakes the reader thread through a condition variable: two thread hand-offs (and GIL hand-overs) per
message, against grpc.aio's one poller wake-up of the loop.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import queue
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

import grpc
import numpy as np
import structlog
from tritonclient.grpc import service_pb2, service_pb2_grpc

from bench.triton_grpc import DeltaTally, encode_request
from edge.upstreams.base import Capacity, Delta, GenerationRequest, UpstreamError
from edge.upstreams.triton import TritonUpstream

if TYPE_CHECKING:
    from bench.triton_h2 import H2SharedStream

log = structlog.get_logger(__name__)

_FINAL = "triton_final_response"
_END = object()  # ends the request iterator, which half-closes the stream


def decode_response(response: Any) -> tuple[list[int], bool]:
    """(new token ids of beam 0, is this the request's final response)."""
    tokens: list[int] = []
    outputs = response.outputs
    for i, out in enumerate(outputs):
        if out.name == "output_ids":
            ids = np.frombuffer(response.raw_output_contents[i], dtype=np.int32)
            for j, other in enumerate(outputs):
                if other.name == "sequence_length":
                    length = int(np.frombuffer(response.raw_output_contents[j], dtype=np.int32)[0])
                    if 0 <= length <= ids.size:
                        ids = ids[:length]
            tokens = ids.tolist()
            break
    params = response.parameters
    final = params[_FINAL].bool_param if _FINAL in params else False
    return tokens, final


Item = tuple[list[int], bool] | BaseException


def response_item(
    name: str, message: Any, decode: Callable[[Any], tuple[list[int], bool]] = decode_response
) -> tuple[str, Item]:
    """A ModelStreamInferResponse as (its request's wire id, what its Inbox gets): the decoded
    tokens and final flag, or the replica's error."""
    response = message.infer_response
    if message.error_message:
        return response.id, UpstreamError(f"{name}: {message.error_message}")
    return response.id, decode(response)


def deliver(inboxes: dict[str, Inbox], wire_id: str, item: Item) -> None:
    """Hand `item` to its request's inbox, forgetting the request once it ended (final or error);
    a response for a request no longer there (stopped, a cancelled tail) is dropped."""
    inbox = inboxes.get(wire_id)
    if inbox is None:
        return
    if isinstance(item, BaseException) or item[1]:
        del inboxes[wire_id]
    inbox.put(item)


class Inbox:
    """The responses of one request, gathered on the event loop until its reader takes them."""

    __slots__ = ("_items", "_loop", "_waiter", "wire_id")

    def __init__(self, wire_id: str, loop: asyncio.AbstractEventLoop) -> None:
        self.wire_id = wire_id
        self._loop = loop
        # (tokens, final) pairs, or one exception that ends the request.
        self._items: deque[tuple[list[int], bool] | BaseException] = deque()
        self._waiter: asyncio.Future[None] | None = None

    def put(self, item: tuple[list[int], bool] | BaseException) -> None:
        """On the loop."""
        self._items.append(item)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def take(self) -> tuple[list[int], bool]:
        """Every token that arrived since the last take, merged; final once the last one came."""
        while not self._items:
            self._waiter = self._loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        tokens: list[int] = []
        while self._items:
            item = self._items.popleft()
            if isinstance(item, BaseException):
                raise item
            tokens.extend(item[0])
            if item[1]:
                return tokens, True
        return tokens, False


class SharedStream:
    """The one ModelStreamInfer stream to a replica, with its reader thread."""

    def __init__(self, name: str, channel: grpc.Channel, loop: asyncio.AbstractEventLoop) -> None:
        self._name = name
        self._loop = loop
        self._inboxes: dict[str, Inbox] = {}
        self._suffixes = itertools.count(1)
        self._requests: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._ready: list[tuple[str, tuple[list[int], bool] | BaseException]] = []
        self.failed: BaseException | None = None
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        self._call = stub.ModelStreamInfer(iter(self._requests.get, _END))
        self._reader = threading.Thread(target=self._read, name=f"triton-stream-{name}", daemon=True)
        self._reader.start()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    @property
    def alive(self) -> bool:
        return self.failed is None

    def submit(self, request: Any) -> Inbox:
        """On the loop: register the request's inbox, then send it.

        The request travels under the edge's own id, so that anyone may stop it with a `stop`
        request of that id, as TensorRT-LLM allows; only an id already in flight on this stream
        gets a suffix, since responses find their request by id.
        """
        if request.id in self._inboxes:
            request.id = f"{request.id}.{next(self._suffixes)}"
        inbox = Inbox(request.id, self._loop)
        self._inboxes[request.id] = inbox
        self._requests.put(request)
        return inbox

    def stop(self, inbox: Inbox, stop_request: Any) -> None:
        """On the loop: forget the request and tell the replica to drop it (the `stop` input)."""
        if self._inboxes.pop(inbox.wire_id, None) is not None and self.alive:
            self._requests.put(stop_request)

    def finish(self, inbox: Inbox) -> None:
        """On the loop: the request ended (final response or error); forget its id."""
        self._inboxes.pop(inbox.wire_id, None)

    def close(self) -> None:
        self._requests.put(_END)
        self._call.cancel()

    def _read(self) -> None:
        """Reader thread: decode each response here, hand the ready ones to the loop in batches."""
        try:
            for message in self._call:
                self._post(*response_item(self._name, message))
            error: BaseException = UpstreamError(f"{self._name}: stream ended")
        except grpc.RpcError as exc:
            code = exc.code() if isinstance(exc, grpc.Call) else None
            details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
            error = UpstreamError(f"{self._name}: {code.name if code else 'RPC'}: {details}")
        except Exception as exc:  # a broken reader must still fail its requests, not hang them
            log.exception("triton stream reader failed", replica=self._name)
            error = UpstreamError(f"{self._name}: stream reader failed: {exc}")
        self._fail_all(error)

    def _post(self, wire_id: str, item: Item) -> None:
        with self._lock:
            first = not self._ready
            self._ready.append((wire_id, item))
        if first:
            self._call_soon(self._drain)

    def _call_soon(self, callback: Any, *args: Any) -> None:
        try:
            self._loop.call_soon_threadsafe(callback, *args)
        except RuntimeError:
            pass  # the loop is closed: nobody is left to read

    def _drain(self) -> None:
        """On the loop: one call for everything the reader posted since the last one."""
        with self._lock:
            ready, self._ready = self._ready, []
        for wire_id, item in ready:
            deliver(self._inboxes, wire_id, item)

    def _fail_all(self, error: BaseException) -> None:
        self.failed = error
        self._call_soon(self._fail_on_loop, error)

    def _fail_on_loop(self, error: BaseException) -> None:
        self._drain()  # what arrived before the failure is delivered first
        inboxes, self._inboxes = self._inboxes, {}
        for inbox in inboxes.values():
            inbox.put(error)


def stop_request(model: str, wire: str) -> Any:
    """The `tensorrt_llm` contract's cancel: the request's id, `input_ids`/`input_lengths`/
    `request_output_len` (required inputs) and stop=true."""
    request = service_pb2.ModelInferRequest(model_name=model, id=wire)
    for name, datatype, array in (
        ("input_ids", "INT32", np.zeros((1, 1), dtype=np.int32)),
        ("input_lengths", "INT32", np.ones((1, 1), dtype=np.int32)),
        ("request_output_len", "INT32", np.ones((1, 1), dtype=np.int32)),
        ("stop", "BOOL", np.ones((1, 1), dtype=np.bool_)),
        ("streaming", "BOOL", np.ones((1, 1), dtype=np.bool_)),
    ):
        request.inputs.add(name=name, datatype=datatype, shape=list(array.shape))
        request.raw_input_contents.append(array.tobytes())
    return request


class AioSharedStream:
    """The same shared stream through grpc.aio: a reader task on the loop, no threads of our own.

    One more option measured (docs/bench-triton.md): it keeps grpc.aio's per-message cost but drops
    the per-request call set-up (a call, its request-iterator task, the shielded first read).
    """

    def __init__(self, name: str, channel: grpc.aio.Channel, loop: asyncio.AbstractEventLoop) -> None:
        self._name = name
        self._loop = loop
        self._inboxes: dict[str, Inbox] = {}
        self._suffixes = itertools.count(1)
        self._requests: asyncio.Queue[Any] = asyncio.Queue()
        self.failed: BaseException | None = None
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        self._call = stub.ModelStreamInfer(self._outgoing())
        self._reader = loop.create_task(self._read())

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    @property
    def alive(self) -> bool:
        return self.failed is None

    async def _outgoing(self) -> AsyncIterator[Any]:
        while (request := await self._requests.get()) is not _END:
            yield request

    def submit(self, request: Any) -> Inbox:
        if request.id in self._inboxes:
            request.id = f"{request.id}.{next(self._suffixes)}"
        inbox = Inbox(request.id, self._loop)
        self._inboxes[request.id] = inbox
        self._requests.put_nowait(request)
        return inbox

    def stop(self, inbox: Inbox, stop_request: Any) -> None:
        if self._inboxes.pop(inbox.wire_id, None) is not None and self.alive:
            self._requests.put_nowait(stop_request)

    def close(self) -> None:
        self._requests.put_nowait(_END)
        self._call.cancel()

    async def _read(self) -> None:
        inboxes = self._inboxes
        try:
            async for message in self._call:
                deliver(inboxes, *response_item(self._name, message))
            error: BaseException = UpstreamError(f"{self._name}: stream ended")
        except asyncio.CancelledError:
            error = UpstreamError(f"{self._name}: stream closed")
        except grpc.aio.AioRpcError as exc:
            error = UpstreamError(f"{self._name}: {exc.code().name}: {exc.details()}")
        self.failed = error
        self._inboxes = {}
        for inbox in inboxes.values():
            inbox.put(error)


class SharedStreamUpstream:
    """`upstream` (a TritonUpstream) with generate() over a shared stream; the rest delegated.

    `kind`: "sync" (SharedStream, the synchronous client on a thread), "aio" (AioSharedStream) or
    "h2" (bench/triton_h2.py: HTTP/2 read by hand, no grpc).
    """

    def __init__(self, upstream: TritonUpstream, grpc_url: str, kind: str = "sync") -> None:
        self.name = upstream.name
        self._upstream = upstream
        self._grpc_url = grpc_url
        self._kind = kind
        self._channel: Any = None
        self._stream: SharedStream | AioSharedStream | H2SharedStream | None = None

    def _shared_stream(self) -> SharedStream | AioSharedStream | H2SharedStream:
        loop = asyncio.get_running_loop()
        if self._stream is not None and (self._stream.loop is not loop or not self._stream.alive):
            self._stream.close()
            self._stream = None
        if self._stream is None and self._kind == "h2":
            from bench.triton_h2 import H2SharedStream  # it imports this module

            self._stream = H2SharedStream(self.name, self._grpc_url, loop)
        if self._stream is None:
            options = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
            if self._kind == "aio":
                self._channel = self._channel or grpc.aio.insecure_channel(self._grpc_url, options=options)
                self._stream = AioSharedStream(self.name, self._channel, loop)
            else:
                self._channel = self._channel or grpc.insecure_channel(self._grpc_url, options=options)
                self._stream = SharedStream(self.name, self._channel, loop)
        return self._stream

    @property
    def stream(self) -> SharedStream | AioSharedStream | H2SharedStream | None:
        """The replica's stream now (None before the first request)."""
        return self._stream

    async def generate(self, req: GenerationRequest) -> AsyncIterator[Delta]:
        up = self._upstream
        extra = up._extra_stop_ids
        if extra:
            req = dataclasses.replace(
                req, stop_ids=[*req.stop_ids, *(t for t in extra if t not in req.stop_ids)]
            )
        request = encode_request(req, up.model_name, end_id=up._end_id, pad_id=up._pad_id)
        stream = self._shared_stream()
        inbox = stream.submit(request)
        tally = DeltaTally(req, set(req.stop_ids) | ({up._end_id} if up._end_id is not None else set()))
        finished = False
        try:
            timeout_s = up._first_timeout_s
            while not finished:
                try:
                    async with asyncio.timeout(timeout_s):
                        tokens, finished = await inbox.take()
                except TimeoutError:
                    raise UpstreamError(f"{self.name}: no response within {timeout_s:.0f} s") from None
                timeout_s = up._stall_timeout_s
                if (delta := tally.delta(tokens, finished)) is not None:
                    yield delta
        finally:
            if not finished:
                stream.stop(inbox, stop_request(up.model_name, inbox.wire_id))

    async def capacity(self) -> Capacity:
        return await self._upstream.capacity()

    async def ready(self) -> bool:
        return await self._upstream.ready()

    async def aclose(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None
        if self._channel is not None:
            closed = self._channel.close()
            if asyncio.iscoroutine(closed):
                await closed
            self._channel = None
        await self._upstream.aclose()
