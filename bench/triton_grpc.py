"""The edge's Triton client before it moved to HTTP `generate_stream`: one grpc.aio
`ModelStreamInfer` stream per request (edge/upstreams/triton.py until 2026-12-01), kept here so
that `bench.triton_clients` and `bench.relay --variants triton,triton-grpc` can put the two side by
side in one run (docs/bench-triton.md).

Why it lost: every token is one gRPC message, and grpc.aio spends its per-message machinery on each
(its poller thread, a loop wake-up, a future per read, a protobuf); the edge's CPU per token through
Triton was 9-20x its figure in front of a zero-cost upstream.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import shutil
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import numpy.typing as npt
from tritonclient.grpc import service_pb2, service_pb2_grpc

from edge.config import Settings
from edge.upstreams.base import Capacity, Delta, GenerationRequest, Upstream, UpstreamError
from edge.upstreams.triton import TritonUpstream, _finish_reason, end_token_ids
from gpu_container.triton.cpu.repository import render_cpu_repository
from gpu_container.triton.launcher import start_local_triton

_FINAL = "triton_final_response"


def _tensor(request: Any, name: str, datatype: str, array: npt.NDArray[Any]) -> None:
    request.inputs.add(name=name, datatype=datatype, shape=list(array.shape))
    request.raw_input_contents.append(np.ascontiguousarray(array).tobytes())


def encode_request(
    req: GenerationRequest, model: str, *, end_id: int | None = None, pad_id: int | None = None
) -> Any:
    """A ModelInferRequest in the `tensorrt_llm` contract (batch of one, streaming), asking for an
    empty final response so the end is a flag on the wire."""
    request = service_pb2.ModelInferRequest(model_name=model, id=req.request_id)
    request.parameters["triton_enable_empty_final_response"].bool_param = True

    def scalar(name: str, datatype: str, value: object, dtype: type[np.generic]) -> None:
        _tensor(request, name, datatype, np.array([[value]], dtype=dtype))

    _tensor(request, "input_ids", "INT32", np.array([req.prompt_ids], dtype=np.int32))
    scalar("input_lengths", "INT32", len(req.prompt_ids), np.int32)
    scalar("request_output_len", "INT32", req.max_new_tokens, np.int32)
    scalar("streaming", "BOOL", True, np.bool_)
    scalar("return_kv_cache_reuse_stats", "BOOL", True, np.bool_)
    greedy = req.temperature == 0
    scalar("runtime_top_k", "INT32", 1 if greedy else 0, np.int32)
    scalar("temperature", "FP32", 1.0 if greedy else req.temperature, np.float32)
    scalar("runtime_top_p", "FP32", req.top_p, np.float32)
    # As the edge's generate_body: TensorRT-LLM samples an unseeded request with seed 0.
    seed = req.seed if req.seed is not None else random.getrandbits(64)
    scalar("random_seed", "UINT64", seed % 2**64, np.uint64)
    if end_id is not None:
        scalar("end_id", "INT32", end_id, np.int32)
    if pad_id is not None:
        scalar("pad_id", "INT32", pad_id, np.int32)
    if req.stop_ids:
        words = [req.stop_ids, list(range(1, len(req.stop_ids) + 1))]
        _tensor(request, "stop_words_list", "INT32", np.array([words], dtype=np.int32))
    return request


def decode_tokens(response: Any) -> list[int]:
    """New token ids of one streamed response (beam 0); empty for the bare final response."""
    names = [out.name for out in response.outputs]
    if "output_ids" not in names:
        return []
    ids = np.frombuffer(response.raw_output_contents[names.index("output_ids")], dtype=np.int32)
    if "sequence_length" in names:
        raw_length = response.raw_output_contents[names.index("sequence_length")]
        length = int(np.frombuffer(raw_length, dtype=np.int32)[0])
        if 0 <= length <= ids.size:
            ids = ids[:length]
    return [int(t) for t in ids]


class DeltaTally:
    """One stream's tokens so far, and the delta each response makes of them (the finish reason on
    the final one), for the gRPC clients measured here."""

    def __init__(self, req: GenerationRequest, stop_tokens: set[int]) -> None:
        self._limit = req.max_new_tokens
        self._stop_tokens = stop_tokens
        self._generated = 0
        self._last: int | None = None

    def delta(self, tokens: list[int], finished: bool) -> Delta | None:
        self._generated += len(tokens)
        if tokens:
            self._last = tokens[-1]
        if finished:
            # The replica's sequence limit is not known here: only max_tokens says "length".
            reason = _finish_reason(self._last, self._stop_tokens, self._generated, self._limit, self._limit)
            return Delta(tokens, reason)
        return Delta(tokens) if tokens else None


async def _first_read(call: Any) -> Any:
    """The first response, read in a task of its own that a cancel cannot reach (grpc.aio's set-up
    task would swallow it)."""
    read = asyncio.ensure_future(call.read())
    try:
        return await asyncio.shield(read)
    except asyncio.CancelledError:
        read.cancel()
        raise


class GrpcAioUpstream:
    """`upstream` (a TritonUpstream) with generate() over one grpc.aio stream per request; the
    rest (capacity, readiness, close) delegated. Closing a stream early cancels its call (the
    model's poll drops the request): the bench does not leave streams early."""

    def __init__(self, upstream: TritonUpstream, grpc_url: str) -> None:
        self.name = upstream.name
        self._upstream = upstream
        self._channel = grpc.aio.insecure_channel(
            grpc_url,
            options=[("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)],
        )
        self._stub = service_pb2_grpc.GRPCInferenceServiceStub(self._channel)

    async def generate(self, req: GenerationRequest) -> AsyncIterator[Delta]:
        up = self._upstream
        end_id = -1 if req.ignore_eos else up._end_id
        if up._extra_stop_ids and not req.ignore_eos:
            stops = [*req.stop_ids, *(t for t in up._extra_stop_ids if t not in req.stop_ids)]
            req = dataclasses.replace(req, stop_ids=stops)
        request = encode_request(req, up.model_name, end_id=end_id, pad_id=up._pad_id)

        async def requests() -> AsyncIterator[Any]:
            yield request

        call = self._stub.ModelStreamInfer(requests())
        tally = DeltaTally(req, set(req.stop_ids) | ({end_id} if end_id is not None else set()))
        finished = False
        first = True
        try:
            while not finished:
                async with asyncio.timeout(up._first_timeout_s if first else up._stall_timeout_s):
                    message = await (_first_read(call) if first else call.read())
                first = False
                if message is grpc.aio.EOF:
                    raise UpstreamError(f"{self.name}: stream ended without a final response")
                if message.error_message:
                    raise UpstreamError(f"{self.name}: {message.error_message}")
                response = message.infer_response
                finished = response.parameters[_FINAL].bool_param if _FINAL in response.parameters else False
                if (delta := tally.delta(decode_tokens(response), finished)) is not None:
                    yield delta
        finally:
            if not finished:
                call.cancel()

    async def capacity(self) -> Capacity:
        return await self._upstream.capacity()

    async def ready(self) -> bool:
        return await self._upstream.ready()

    async def aclose(self) -> None:
        await self._channel.close()
        await self._upstream.aclose()


def local_grpc_upstreams(kind: str) -> Any:
    """An upstream provider (edge/upstreams/local_pool.py) starting a local tritonserver over the
    CPU repository and reaching it with a gRPC client: "grpc" (GrpcAioUpstream) or "shared"
    (bench/triton_shared_stream.py)."""

    @asynccontextmanager
    async def provide(settings: Settings, model_dir: Path) -> AsyncIterator[list[Upstream]]:
        from bench.triton_shared_stream import SharedStreamUpstream

        repo_dir = Path(tempfile.mkdtemp(prefix="bench-grpc-repo-"))
        render_cpu_repository(repo_dir, model_dir, settings.engine.engine_config())
        server = await asyncio.to_thread(start_local_triton, repo_dir)
        eos = end_token_ids(model_dir)
        http = TritonUpstream(
            f"triton-{kind}",
            server.http_url,
            server.metrics_url,
            end_id=eos[0] if eos else None,
            pad_id=eos[0] if eos else None,
            extra_stop_ids=tuple(eos[1:]),
        )
        upstream: Upstream
        if kind == "grpc":
            upstream = GrpcAioUpstream(http, server.grpc_url)
        else:
            upstream = SharedStreamUpstream(http, server.grpc_url)
        try:
            yield [upstream]
        finally:
            await upstream.aclose()
            await asyncio.to_thread(server.stop)
            shutil.rmtree(repo_dir, ignore_errors=True)

    return provide
