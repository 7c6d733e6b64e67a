"""The Triton client's own CPU per token, five ways, against one local tritonserver in one run.

    .venv/bin/python -m bench.triton_clients [--streams 1,64] [--max-tokens 128] [--repeat 3]

Only the client runs in this process (tritonserver is its own process), so this process's CPU
time over a load, divided by the tokens it received, is what the client costs the edge per token:

- sse: Triton's HTTP `generate_stream` read off the socket (edge/upstreams/triton_sse.py, the
  edge's client since 2026-12-01): one keep-alive connection per stream, httptools and msgspec;
- aio: one grpc.aio stream per request (bench/triton_grpc.py, the edge's client before);
- shared: one synchronous gRPC stream per replica carrying every request, read on a thread that
  hands the ready responses to the loop in batches (bench/triton_shared_stream.py);
- aio-shared: one grpc.aio stream per replica carrying every request, read by one task;
- httpx: Triton's HTTP `generate_stream` read with httpx's line iterator, one request each.

Variants alternate within each repeat, so load from elsewhere hits them alike; the median is shown.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import httpx

from bench.triton_grpc import GrpcAioUpstream
from bench.triton_shared_stream import SharedStreamUpstream
from edge.upstreams.base import GenerationRequest, Upstream
from edge.upstreams.triton import TritonUpstream
from gpu_container.engine.demo_model import build_demo_model
from gpu_container.engine.types import EngineConfig
from gpu_container.triton.cpu.repository import render_cpu_repository
from gpu_container.triton.launcher import start_local_triton

Stream = Callable[[str, list[int], int], AsyncIterator[int]]


def upstream_stream(upstream: Upstream) -> Stream:
    async def stream(rid: str, prompt: list[int], max_tokens: int) -> AsyncIterator[int]:
        async for delta in upstream.generate(GenerationRequest(rid, prompt, max_tokens, temperature=0.0)):
            yield len(delta.token_ids)

    return stream


def http_stream(client: httpx.AsyncClient, base_url: str) -> Stream:
    url = f"{base_url}/v2/models/tensorrt_llm/generate_stream"

    async def stream(rid: str, prompt: list[int], max_tokens: int) -> AsyncIterator[int]:
        body = {
            "id": rid,
            "input_ids": prompt,
            "input_lengths": [len(prompt)],
            "request_output_len": [max_tokens],
            "streaming": [True],
            "end_id": [-1],
            "runtime_top_k": [1],
        }
        async with client.stream("POST", url, json=body) as response:
            response.raise_for_status()
            async for line in response.aiter_lines():
                if line.startswith("data:"):
                    event = json.loads(line[5:])
                    if "error" in event:
                        raise RuntimeError(event["error"])
                    ids = event.get("output_ids", [])
                    yield len(ids) if isinstance(ids, list) else 1

    return stream


async def load(stream: Stream, streams: int, max_tokens: int) -> tuple[int, float, float]:
    """(tokens received, client CPU seconds, wall seconds) of `streams` concurrent requests."""
    prompt = list(range(3, 35))

    async def one(i: int) -> int:
        return sum([n async for n in stream(f"r{i}-{time.monotonic_ns()}", prompt, max_tokens)])

    cpu0, wall0 = time.process_time(), time.perf_counter()
    counts = await asyncio.gather(*(one(i) for i in range(streams)))
    return sum(counts), time.process_time() - cpu0, time.perf_counter() - wall0


async def main_async(args: argparse.Namespace) -> None:
    config = EngineConfig(max_num_seqs=64, num_blocks=2048)
    with tempfile.TemporaryDirectory(prefix="bench-triton-clients-") as tmp:
        model_dir = build_demo_model(Path(tmp) / "model")
        repository = render_cpu_repository(Path(tmp) / "repository", model_dir, config)
        server = await asyncio.to_thread(start_local_triton, repository)

        def upstream(name: str) -> TritonUpstream:
            return TritonUpstream(name, server.http_url, server.metrics_url, end_id=-1)

        sse = upstream("sse")
        aio = GrpcAioUpstream(upstream("aio"), server.grpc_url)
        shared = SharedStreamUpstream(upstream("shared"), server.grpc_url)
        aio_shared = SharedStreamUpstream(upstream("aio-shared"), server.grpc_url, kind="aio")
        http = httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=1000))
        variants: dict[str, Stream] = {
            "sse": upstream_stream(sse),
            "aio": upstream_stream(aio),
            "shared": upstream_stream(shared),
            "aio-shared": upstream_stream(aio_shared),
            "httpx": http_stream(http, server.http_url),
        }
        try:
            for n in [int(x) for x in args.streams.split(",")]:
                per_token: dict[str, list[float]] = {name: [] for name in variants}
                tokens_per_s: dict[str, list[float]] = {name: [] for name in variants}
                for _ in range(args.repeat):
                    for name, stream in variants.items():
                        run: Awaitable[tuple[int, float, float]] = load(stream, n, args.max_tokens)
                        tokens, cpu, wall = await run
                        per_token[name].append(cpu / max(tokens, 1) * 1e6)
                        tokens_per_s[name].append(tokens / wall)
                base = statistics.median(per_token["aio"])
                for name in variants:
                    us = statistics.median(per_token[name])
                    print(
                        json.dumps(
                            {
                                "client": name,
                                "streams": n,
                                "client_cpu_us_per_token": round(us, 1),
                                "x_aio": round(us / base, 2),
                                "tokens_per_s": round(statistics.median(tokens_per_s[name])),
                            }
                        ),
                        flush=True,
                    )
        finally:
            await sse.aclose()
            await shared.aclose()
            await aio.aclose()
            await aio_shared.aclose()
            await http.aclose()
            await asyncio.to_thread(server.stop)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Triton client CPU per token, five ways.")
    parser.add_argument("--streams", default="1,64")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=3)
    asyncio.run(main_async(parser.parse_args(argv)))


if __name__ == "__main__":
    main()
