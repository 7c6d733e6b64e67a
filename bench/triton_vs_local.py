"""The same load through the in-process engine and through a local tritonserver running it.

    .venv/bin/python -m bench.triton_vs_local [--streams 100] [--max-tokens 64] [--doc docs/bench-triton.md]

N concurrent streams, each a distinct prompt with a fixed output length (the end token ignored, so
every run generates exactly streams x max_tokens tokens). The in-process side reads the engine's
async API directly; the Triton side goes through TritonUpstream (gRPC stream per request, our engine
as a decoupled Python-backend model). Both engines have the same configuration and model and run
one after the other, never at once. The difference is what Triton adds: gRPC, the backend's
shared-memory IPC, one response per token.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bench.triton_shared_stream import SharedStreamUpstream
from edge.upstreams.base import GenerationRequest, Upstream
from edge.upstreams.triton import TritonUpstream
from gpu_container.engine.async_engine import AsyncEngine
from gpu_container.engine.demo_model import build_demo_model
from gpu_container.engine.engine import LLMEngine
from gpu_container.engine.types import EngineConfig
from gpu_container.triton.cpu.repository import render_cpu_repository
from gpu_container.triton.launcher import start_local_triton

# Token lists a stream yields, one list per response.
Generate = Callable[[str, list[int], int], AsyncIterator[list[int]]]


@dataclass(frozen=True)
class RunResult:
    label: str
    streams: int
    tokens: int
    wall_s: float
    ttft_s: list[float]
    inter_token_s: list[float]

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s

    def ttft_ms(self, q: float) -> float:
        return float(np.percentile(self.ttft_s, q) * 1000)

    def itl_ms(self, q: float) -> float:
        return float(np.percentile(self.inter_token_s, q) * 1000) if self.inter_token_s else 0.0


async def _one(
    generate: Generate, rid: str, prompt: list[int], max_tokens: int
) -> tuple[float, list[float], int]:
    start = time.perf_counter()
    last = start
    ttft = 0.0
    gaps: list[float] = []
    count = 0
    async for tokens in generate(rid, prompt, max_tokens):
        now = time.perf_counter()
        if count == 0:
            ttft = now - start
        elif tokens:
            gaps.append((now - last) / len(tokens))
        last = now
        count += len(tokens)
    return ttft, gaps, count


async def run_load(
    label: str, generate: Generate, streams: int, max_tokens: int, prompt_len: int
) -> RunResult:
    # A few warm-up requests so neither side pays first-call costs inside the measurement.
    await asyncio.gather(*(_one(generate, f"warm-{i}", [1 + i, 2, 3], 4) for i in range(4)))
    prompts = [[(7 * i + j) % 900 + 10 for j in range(prompt_len)] for i in range(streams)]
    start = time.perf_counter()
    results = await asyncio.gather(
        *(_one(generate, f"{label}-{i}", prompts[i], max_tokens) for i in range(streams))
    )
    wall = time.perf_counter() - start
    tokens = sum(count for _, _, count in results)
    if tokens != streams * max_tokens:
        raise RuntimeError(f"{label}: {tokens} tokens, expected {streams * max_tokens}")
    return RunResult(
        label,
        streams,
        tokens,
        wall,
        [ttft for ttft, _, _ in results],
        [gap for _, gaps, _ in results for gap in gaps],
    )


def upstream_generate(upstream: Upstream) -> Generate:
    """Fixed-length replies (ignore_eos) from any replica, the engine's front or Triton."""

    async def generate(rid: str, prompt: list[int], max_tokens: int) -> AsyncIterator[list[int]]:
        req = GenerationRequest(rid, prompt, max_new_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        async for delta in upstream.generate(req):
            yield delta.token_ids

    return generate


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (
        f"{cpu}, {os.cpu_count()} CPUs visible, load average {os.getloadavg()[0]:.1f} at start; "
        f"Python {platform.python_version()}, numpy {np.__version__}, "
        "tritonserver 2.51 (nvidia-pytriton 0.7.0)"
    )


def render_report(
    results: list[RunResult],
    runs: dict[str, list[RunResult]],
    args: argparse.Namespace,
    config: EngineConfig,
    where: str,
) -> str:
    rows = [
        f"| {r.label} | {r.tokens_per_s:,.0f} | {r.ttft_ms(50):.0f} | {r.ttft_ms(99):.0f} "
        f"| {r.itl_ms(50):.1f} | {r.itl_ms(99):.1f} | {r.wall_s:.2f} |"
        for r in results
    ]
    local, *tritons = results
    every_run = "; ".join(
        f"{label} " + ", ".join(f"{r.tokens_per_s:,.0f}" for r in label_runs)
        for label, label_runs in runs.items()
    )
    return "\n".join(
        [
            "# Triton vs in-process engine",
            "",
            "Same load, same engine, same demo model, one after the other:",
            f"{args.streams} concurrent streams, prompts of {args.prompt_len} tokens, "
            f"exactly {args.max_tokens} output tokens each (greedy, end token ignored).",
            f"Engine: block_size {config.block_size}, num_blocks {config.num_blocks}, "
            f"max_num_seqs {config.max_num_seqs}, max_num_batched_tokens {config.max_num_batched_tokens}.",
            "",
            "| path | tokens/s | TTFT p50 (ms) | TTFT p99 (ms) | inter-token p50 (ms) "
            "| inter-token p99 (ms) | wall (s) |",
            "|---|---:|---:|---:|---:|---:|---:|",
            *rows,
            "",
            f"Each row is the median-throughput run of {args.repeat} per path (alternating); "
            f"tokens/s of every run: {every_run}.",
            "",
            *(
                f"{t.label} delivers {t.tokens_per_s / local.tokens_per_s:.0%} of the in-process "
                f"throughput; its TTFT p50 is {t.ttft_ms(50) / local.ttft_ms(50):.2f}x the in-process one."
                for t in tritons
            ),
            "",
            f"Machine: {where}.",
            "",
            "Reproduce: `.venv/bin/python -m bench.triton_vs_local "
            f"--streams {args.streams} --max-tokens {args.max_tokens} --prompt-len {args.prompt_len} "
            f"--repeat {args.repeat}`.",
            "",
            "Reading it. What the Triton path adds per token: one gRPC stream message, one response",
            "through the Python backend's shared-memory IPC, and a cancellation probe per live request",
            "every `cancellation_check_period_ms`. Responses go out from one sender thread while the",
            "engine keeps stepping (a request whose last response is still in flight gets its next",
            "tokens merged into one response), so throughput stays close to the in-process engine.",
            "TTFT is where the burst shows: all streams open at once, and their first responses leave",
            "one IPC round trip after another from a thread that shares the GIL with the engine; an",
            "idle request sees ~1 ms more than in process (`--streams 1`). On two CPU cores shared",
            "with other work, single runs swing by tens of percent: compare the medians, not one run.",
            "",
        ]
    )


def median_run(runs: list[RunResult]) -> RunResult:
    """The run with the median throughput: on a shared machine single runs swing."""
    return sorted(runs, key=lambda r: r.tokens_per_s)[len(runs) // 2]


async def main_async(args: argparse.Namespace) -> list[RunResult]:
    where = machine()
    config = EngineConfig(max_num_seqs=max(64, args.streams), num_blocks=2048)
    runs: dict[str, list[RunResult]] = {"in-process": [], "triton": [], "triton-shared": []}
    with tempfile.TemporaryDirectory(prefix="bench-triton-") as tmp:
        model_dir = build_demo_model(Path(tmp) / "model")
        engine = LLMEngine.from_pretrained(model_dir, config)
        engine.start()
        repository = render_cpu_repository(Path(tmp) / "repository", model_dir, config)
        server = await asyncio.to_thread(start_local_triton, repository)
        # end_id -1: TensorRT-LLM's "ignore the end token", so the output length is fixed here too.
        upstream = TritonUpstream("bench", server.grpc_url, server.metrics_url, end_id=-1)
        # The measured alternative (one synchronous stream per replica), for the comparison.
        shared = SharedStreamUpstream(
            TritonUpstream("bench-shared", server.grpc_url, server.metrics_url, end_id=-1)
        )
        paths = {
            "in-process": upstream_generate(AsyncEngine(engine)),
            "triton": upstream_generate(upstream),
            "triton-shared": upstream_generate(shared),
        }
        try:
            # Alternate the paths so a burst of load from elsewhere hits both alike.
            for _ in range(args.repeat):
                for label, generate in paths.items():
                    result = await run_load(label, generate, args.streams, args.max_tokens, args.prompt_len)
                    runs[label].append(result)
        finally:
            await upstream.aclose()
            await shared.aclose()
            await asyncio.to_thread(server.stop)
            engine.stop()
    results = [median_run(label_runs) for label_runs in runs.values()]
    report = render_report(results, runs, args, config, where)
    print(report)
    if args.doc:
        args.doc.write_text(report)
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Triton vs in-process engine, same load.")
    parser.add_argument("--streams", type=int, default=100)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument(
        "--repeat", type=int, default=3, help="runs per path, alternating; the median is shown"
    )
    parser.add_argument("--doc", type=Path, help="write the Markdown report here")
    asyncio.run(main_async(parser.parse_args(argv)))


if __name__ == "__main__":
    main()
