"""A burst of prompts on a just-started replica against the same burst once it is warm.

python -m bench.cold_burst [--paths local,triton] [--bursts 3] [--streams 16] [--pause 3]

Each path starts its own edge on the real model (bench/edge_server.py: the in-process engine, or
local Triton with the CPU model), then sends `--streams` new prompts at once, `--bursts` times with
`--pause` seconds between, and prints each burst's time to first token at the client (p50, max, and
every stream's). The first burst is what a replica that just joined meets; the later ones, a warm
replica. Why it matters and what it found: gpu_container/engine/kv_cache.py, docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

import aiohttp

from bench.__main__ import machine
from bench.edge_server import edge_process
from bench.loadgen import one_stream

MODEL = "smollm2-135m-instruct"


async def burst(base_url: str, key: str, streams: int, max_tokens: int) -> list[float]:
    """Every stream's TTFT in ms; a new prompt each, so no prefix cache helps."""
    url = base_url + "/v1/chat/completions"
    prompts = [f"Tell me about continuous batching, take {i}." for i in range(streams)]
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        results = await asyncio.gather(
            *(one_stream(session, url, key, prompt, max_tokens, MODEL) for prompt in prompts)
        )
    errors = [r.error for r in results if r.error]
    if errors:
        raise RuntimeError(f"streams failed: {errors}")
    return sorted(round(r.ttft_s * 1e3, 1) for r in results if r.ttft_s is not None)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.cold_burst")
    parser.add_argument("--paths", default="local,triton")
    parser.add_argument("--bursts", type=int, default=3)
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--pause", type=float, default=3.0)
    args = parser.parse_args()
    print(f"machine: {machine()}, model: {MODEL}", flush=True)
    for path in args.paths.split(","):
        with edge_process(triton="local" if path == "triton" else None, model=MODEL) as edge:
            for index in range(args.bursts):
                ttfts = asyncio.run(burst(edge.base_url, edge.key, args.streams, args.max_tokens))
                row = {
                    "path": path,
                    "burst": index,
                    "ttft_p50_ms": statistics.median(ttfts),
                    "ttft_max_ms": ttfts[-1],
                    "ttfts_ms": ttfts,
                }
                print(json.dumps(row), flush=True)
                time.sleep(args.pause)


if __name__ == "__main__":
    main()
