"""The Triton client's own CPU per token, six ways, against one local tritonserver in one run.

    .venv/bin/python -m bench.triton_clients [--streams 1,64] [--max-tokens 128] [--repeat 3]

Only the client runs in this process (tritonserver is its own process), so this process's CPU
time over a load, divided by the tokens it received, is what the client costs the edge per token:

- sse: Triton's HTTP `generate_stream` read off the socket (edge/upstreams/triton_sse.py, the
  edge's client since 2026-12-01): one keep-alive connection per stream, httptools and msgspec;
- aio: one grpc.aio stream per request (bench/triton_grpc.py, the edge's client before);
- shared: one synchronous gRPC stream per replica carrying every request, read on a thread that
  hands the ready responses to the loop in batches (bench/triton_shared_stream.py);
- aio-shared: one grpc.aio stream per replica carrying every request, read by one task;
- httpx: Triton's HTTP `generate_stream` read with httpx's line iterator, one request each;
- h2-shared: one gRPC stream per replica carrying every request, its HTTP/2 read by hand with no
  grpc machinery (bench/triton_h2.py).

Each run is a process of its own on uvloop (as the edge runs), so no client's background threads
(grpc's pollers, the shared stream's reader) bill another's figure; variants alternate within each
repeat, so load from elsewhere hits them alike; the median is shown.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import uvloop

from bench.names import names_of
from bench.triton_grpc import GrpcAioUpstream
from bench.triton_h2 import H2SharedStream
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


VARIANTS = ("sse", "aio", "shared", "aio-shared", "httpx", "h2-shared")


async def run_one(args: argparse.Namespace) -> None:
    """One load through one client, in a process of its own (`--one`): no other client's threads
    (grpc's pollers, the shared stream's reader) run beside it and bill this process."""
    http_url, grpc_url, metrics_url = args.urls.split(",")

    def upstream(name: str) -> TritonUpstream:
        return TritonUpstream(name, http_url, metrics_url, end_id=-1)

    client: Any
    if args.one == "sse":
        client = upstream("sse")
    elif args.one == "aio":
        client = GrpcAioUpstream(upstream("aio"), grpc_url)
    elif args.one in ("shared", "aio-shared", "h2-shared"):
        kind = {"shared": "sync", "aio-shared": "aio", "h2-shared": "h2"}[args.one]
        client = SharedStreamUpstream(upstream(args.one), grpc_url, kind=kind)
    else:
        client = httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=1000))
    stream = http_stream(client, http_url) if args.one == "httpx" else upstream_stream(client)
    try:
        # Warm: first connections, lazy imports and first calls are not what a token costs.
        await load(stream, args.streams_one, 8)
        wire = _wire_counts(client)
        tokens, cpu, wall = await load(stream, args.streams_one, args.max_tokens)
        run: dict[str, float] = {"tokens": tokens, "cpu_s": cpu, "wall_s": wall}
        if wire is not None and (after := _wire_counts(client)) is not None:
            run["reads_per_message"] = (after[0] - wire[0]) / max(after[1] - wire[1], 1)
    finally:
        await client.aclose()
    print(json.dumps(run), flush=True)


def _wire_counts(client: object) -> tuple[int, int] | None:
    """(reads, messages) so far where the client counts them (h2-shared), else None."""
    stream = client.stream if isinstance(client, SharedStreamUpstream) else None
    if not isinstance(stream, H2SharedStream):
        return None
    return stream.reads, stream.messages


def main_runs(args: argparse.Namespace) -> None:
    config = EngineConfig(max_num_seqs=64, num_blocks=2048)
    variants = args.clients.split(",")
    with tempfile.TemporaryDirectory(prefix="bench-triton-clients-") as tmp:
        model_dir = build_demo_model(Path(tmp) / "model")
        repository = render_cpu_repository(Path(tmp) / "repository", model_dir, config)
        server = start_local_triton(repository)
        urls = f"{server.http_url},{server.grpc_url},{server.metrics_url}"
        try:
            for n in [int(x) for x in args.streams.split(",")]:
                per_token: dict[str, list[float]] = {name: [] for name in variants}
                tokens_per_s: dict[str, list[float]] = {name: [] for name in variants}
                reads_per_message: dict[str, list[float]] = {name: [] for name in variants}
                for _ in range(args.repeat):
                    for name in variants:
                        cmd = [sys.executable, "-m", "bench.triton_clients", "--one", name, "--urls", urls]
                        cmd += ["--streams-one", str(n), "--max-tokens", str(args.max_tokens)]
                        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
                        run = json.loads(out.strip().splitlines()[-1])
                        per_token[name].append(run["cpu_s"] / max(run["tokens"], 1) * 1e6)
                        tokens_per_s[name].append(run["tokens"] / run["wall_s"])
                        if "reads_per_message" in run:
                            reads_per_message[name].append(run["reads_per_message"])
                base = statistics.median(per_token[variants[0]])
                for name in variants:
                    us = statistics.median(per_token[name])
                    row: dict[str, object] = {
                        "client": name,
                        "streams": n,
                        "client_cpu_us_per_token": round(us, 1),
                        f"x_{variants[0]}": round(us / base, 2),
                        "tokens_per_s": round(statistics.median(tokens_per_s[name])),
                    }
                    if reads_per_message[name]:
                        row["reads_per_message"] = round(statistics.median(reads_per_message[name]), 3)
                    print(json.dumps(row), flush=True)
        finally:
            server.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Triton client CPU per token, six ways.")
    parser.add_argument("--streams", default="1,64")
    parser.add_argument(
        "--clients", default=",".join(VARIANTS), type=names_of(VARIANTS), help="the first is the ratios' base"
    )
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--one", choices=VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--urls", help=argparse.SUPPRESS)
    parser.add_argument("--streams-one", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        uvloop.run(run_one(args))
    else:
        main_runs(args)


if __name__ == "__main__":
    main()
