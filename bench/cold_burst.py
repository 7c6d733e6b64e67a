"""A burst of prompts on a just-started replica against the same burst once it is warm.

python -m bench.cold_burst [--paths local,triton] [--bursts 3] [--streams 16] [--pause 3]

Each path starts its own edge on the real model (bench/edge_server.py: the in-process engine, or
local Triton with the CPU model), then sends `--streams` new prompts at once, `--bursts` times with
`--pause` seconds between, and prints each burst's time to first token at the client (p50, max, and
every stream's) and the prompt tokens the replica found in its prefix cache. The first burst is what
a replica that just joined meets; the later ones, a warm replica. Every prompt of every burst is new
from its first word: the template's system prompt is all a later burst finds cached, as any prompt
on a warm replica would (until 2026-12-03 each burst repeated the first's prompts, and a later
burst's prefix cache hits read as warmth). Why it matters and what it found:
gpu_container/engine/kv_cache.py, docs/benchmarks.md.
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
from bench.names import names_of

MODEL = "smollm2-135m-instruct"


async def burst(
    base_url: str, key: str, streams: int, max_tokens: int, index: int
) -> tuple[list[float], int]:
    """Every stream's TTFT in ms, and the prompt tokens found in the prefix cache; a prompt no
    earlier burst sent, different from its first word."""
    url = base_url + "/v1/chat/completions"
    prompts = [f"Take {index}.{i}: tell me about continuous batching." for i in range(streams)]
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        results = await asyncio.gather(
            *(one_stream(session, url, key, prompt, max_tokens, MODEL) for prompt in prompts)
        )
    errors = [r.error for r in results if r.error]
    if errors:
        raise RuntimeError(f"streams failed: {errors}")
    ttfts = sorted(round(r.ttft_s * 1e3, 1) for r in results if r.ttft_s is not None)
    return ttfts, sum(r.cached_tokens for r in results)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.cold_burst")
    parser.add_argument("--paths", default="local,triton", type=names_of(("local", "triton")))
    parser.add_argument("--bursts", type=int, default=3)
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--pause", type=float, default=3.0)
    args = parser.parse_args()
    print(f"machine: {machine()}, model: {MODEL}", flush=True)
    for path in args.paths.split(","):
        with edge_process(triton="local" if path == "triton" else None, model=MODEL) as edge:
            for index in range(args.bursts):
                ttfts, cached = asyncio.run(
                    burst(edge.base_url, edge.key, args.streams, args.max_tokens, index)
                )
                row = {
                    "path": path,
                    "burst": index,
                    "ttft_p50_ms": statistics.median(ttfts),
                    "ttft_max_ms": ttfts[-1],
                    "ttfts_ms": ttfts,
                    "cached_prompt_tokens": cached,
                }
                print(json.dumps(row), flush=True)
                time.sleep(args.pause)


if __name__ == "__main__":
    main()
