"""Async load generator: N concurrent chat-completion streams against an edge for a duration.

aiohttp, not httpx: httpx's pool scans its connections linearly and collapses at hundreds of open
streams, which would make the generator the bottleneck of what it measures.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field

import aiohttp


@dataclass
class StreamResult:
    ttft_s: float | None = None
    inter_token_s: list[float] = field(default_factory=list)
    completion_tokens: int = 0
    # Of the prompt's tokens, those the replica found in its prefix cache (Triton reports none).
    cached_tokens: int = 0
    error: str | None = None


@dataclass
class LoadResult:
    streams: list[StreamResult]
    wall_s: float

    @property
    def errors(self) -> int:
        return sum(1 for s in self.streams if s.error)

    @property
    def tokens(self) -> int:
        return sum(s.completion_tokens for s in self.streams)


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    idx = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[idx]


async def one_stream(
    session: aiohttp.ClientSession, url: str, key: str, prompt: str, max_tokens: int, model: str
) -> StreamResult:
    result = StreamResult()
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "stream": True,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream_options": {"include_usage": True},
    }
    start = time.perf_counter()
    last: float | None = None
    try:
        async with session.post(url, json=body, headers={"Authorization": f"Bearer {key}"}) as resp:
            if resp.status != 200:
                result.error = f"http {resp.status}"
                await resp.read()
                return result
            async for raw in resp.content:
                line = raw.strip()
                if not line.startswith(b"data: "):
                    continue
                payload = line[6:]
                if payload == b"[DONE]":
                    break
                event = json.loads(payload)
                if "error" in event:
                    result.error = str(event["error"].get("code") or event["error"].get("type"))
                    continue
                if usage := event.get("usage"):
                    result.completion_tokens = int(usage["completion_tokens"])
                    result.cached_tokens = int(
                        (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
                    )
                for choice in event.get("choices", []):
                    if choice.get("delta", {}).get("content"):
                        now = time.perf_counter()
                        if result.ttft_s is None:
                            result.ttft_s = now - start
                        elif last is not None:
                            result.inter_token_s.append(now - last)
                        last = now
    except (TimeoutError, aiohttp.ClientError) as exc:
        result.error = type(exc).__name__
    return result


async def run_load(
    base_url: str,
    key: str,
    *,
    concurrency: int,
    duration_s: float,
    max_tokens: int,
    prompt: str = "Tell me about continuous batching.",
    model: str = "floodgate-tiny",
) -> LoadResult:
    """Keep `concurrency` streams open until `duration_s` has passed, then let the last ones finish."""
    url = f"{base_url}/v1/chat/completions"
    deadline = time.perf_counter() + duration_s
    results: list[StreamResult] = []
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None, sock_read=300)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def worker() -> None:
            while time.perf_counter() < deadline:
                results.append(await one_stream(session, url, key, prompt, max_tokens, model))

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - start
    return LoadResult(results, wall)


def summarize(
    name: str, load: LoadResult, cpu_s: float | None = None, engine_cpu_s: float | None = None
) -> dict[str, str]:
    ttfts = [s.ttft_s for s in load.streams if s.ttft_s is not None]
    itls = [x for s in load.streams for x in s.inter_token_s]
    row = {
        "run": name,
        "streams": str(len(load.streams)),
        "TTFT p50 ms": f"{percentile(ttfts, 50) * 1e3:.1f}",
        "TTFT p99 ms": f"{percentile(ttfts, 99) * 1e3:.1f}",
        "ITL p50 ms": f"{percentile(itls, 50) * 1e3:.2f}",
        "ITL p99 ms": f"{percentile(itls, 99) * 1e3:.2f}",
        "tokens/s": f"{load.tokens / load.wall_s:.0f}",
        "errors": str(load.errors),
    }
    if cpu_s is not None:
        row["edge CPU µs/token"] = f"{cpu_s / max(load.tokens, 1) * 1e6:.0f}"
    if engine_cpu_s is not None:
        row["engine CPU µs/token"] = f"{engine_cpu_s / max(load.tokens, 1) * 1e6:.0f}"
    return row


def markdown_table(rows: list[dict[str, str]]) -> str:
    cols = list(dict.fromkeys(k for row in rows for k in row))
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(row.get(c, "") for c in cols) + " |" for row in rows]
    return "\n".join(lines)
