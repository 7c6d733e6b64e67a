"""The same load through the in-process engine and through a local tritonserver running it.

    .venv/bin/python -m bench.triton_vs_local [--streams 100] [--max-tokens 64] [--doc docs/bench-triton.md]
        [--paths triton,triton-shared] [--baseline-code DIR]

N concurrent streams, each a distinct prompt with a fixed output length (the end token ignored, so
every run generates exactly streams x max_tokens tokens). The in-process side reads the engine's
async API directly; the Triton side goes through TritonUpstream (gRPC stream per request, our engine
as a decoupled Python-backend model). Both engines have the same configuration and model and run
one after the other, never at once. The difference is what Triton adds: gRPC, the backend's
shared-memory IPC, one response per token or few. Each Triton row also gives the replica's own CPU
per token (tritonserver and its Python-backend stub, read from /proc).

`--baseline-code DIR` adds a `triton-baseline` path: a second tritonserver whose CPU model runs the
code of another checkout (e.g. `git worktree add /tmp/base main~3`), so a change to the model is
measured before and after in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from bench.triton_shared_stream import SharedStreamUpstream
from edge.upstreams.base import GenerationRequest, Upstream
from edge.upstreams.triton import TritonUpstream
from gpu_container.engine.async_engine import AsyncEngine
from gpu_container.engine.demo_model import build_demo_model
from gpu_container.engine.engine import LLMEngine
from gpu_container.engine.types import EngineConfig
from gpu_container.triton.cpu.repository import render_cpu_repository
from gpu_container.triton.launcher import TritonProcess, start_local_triton

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
    # CPU seconds the replica process tree spent (Triton paths only).
    replica_cpu_s: float | None = None

    @property
    def replica_us_per_token(self) -> float | None:
        return None if self.replica_cpu_s is None else self.replica_cpu_s / self.tokens * 1e6

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


def tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of `pid` and its children: tritonserver and its backend stubs."""
    children = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    total = 0.0
    for member in [pid, *map(int, children)]:
        try:
            fields = Path(f"/proc/{member}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


async def run_load(
    label: str,
    generate: Generate,
    streams: int,
    max_tokens: int,
    prompt_len: int,
    replica_pid: int | None = None,
) -> RunResult:
    # A few warm-up requests so neither side pays first-call costs inside the measurement.
    await asyncio.gather(*(_one(generate, f"warm-{i}", [1 + i, 2, 3], 4) for i in range(4)))
    prompts = [[(7 * i + j) % 900 + 10 for j in range(prompt_len)] for i in range(streams)]
    cpu_before = tree_cpu_s(replica_pid) if replica_pid is not None else 0.0
    start = time.perf_counter()
    results = await asyncio.gather(
        *(_one(generate, f"{label}-{i}", prompts[i], max_tokens) for i in range(streams))
    )
    wall = time.perf_counter() - start
    replica_cpu = tree_cpu_s(replica_pid) - cpu_before if replica_pid is not None else None
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
        replica_cpu,
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


def _median(values: list[float]) -> float:
    return float(np.median(values))


def render_report(
    runs: dict[str, list[RunResult]], args: argparse.Namespace, config: EngineConfig, where: str
) -> str:
    """Each figure is the median over the runs of its path (single runs swing on a shared box);
    the ratios are of those medians, against the in-process path of the same run."""
    local = runs["in-process"]
    local_tps = _median([r.tokens_per_s for r in local])
    local_ttft = _median([r.ttft_ms(50) for r in local])
    rows = []
    for label, label_runs in runs.items():
        tps = _median([r.tokens_per_s for r in label_runs])
        ttft = _median([r.ttft_ms(50) for r in label_runs])
        replica = [r.replica_us_per_token for r in label_runs if r.replica_us_per_token is not None]
        rows.append(
            f"| {label} | {tps:,.0f} | {tps / local_tps:.2f} | {ttft:.0f} | {ttft / local_ttft:.2f} "
            f"| {_median([r.ttft_ms(99) for r in label_runs]):.0f} "
            f"| {_median([r.itl_ms(50) for r in label_runs]):.1f} "
            f"| {_median([r.itl_ms(99) for r in label_runs]):.1f} "
            f"| {f'{_median(replica):.0f}' if replica else '-'} |"
        )
    every_run = "; ".join(
        f"{label} " + ", ".join(f"{r.tokens_per_s:,.0f} ({r.ttft_ms(50):.0f} ms)" for r in label_runs)
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
            "| path | tokens/s | x in-process | TTFT p50 (ms) | x in-process | TTFT p99 (ms) "
            "| inter-token p50 (ms) | inter-token p99 (ms) | replica CPU (us/token) |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
            *rows,
            "",
            f"Medians of {args.repeat} runs per path (alternating). Every run, tokens/s (TTFT p50): "
            f"{every_run}.",
            "",
            f"Machine: {where}.",
            "",
            "Reproduce: `.venv/bin/python -m bench.triton_vs_local "
            f"--streams {args.streams} --max-tokens {args.max_tokens} --prompt-len {args.prompt_len} "
            f"--repeat {args.repeat} --paths {args.paths}"
            + (" --baseline-code DIR" if args.baseline_code is not None else "")
            + "`.",
            "",
        ]
    )


def _with_model_code(repository: Path, code_dir: Path) -> None:
    """Point the CPU model of `repository` at the code of another checkout (its python_path)."""
    for config_path in repository.glob("*/config.pbtxt"):
        config = text_format.Parse(config_path.read_text(), model_config_pb2.ModelConfig())
        rest = config.parameters["python_path"].string_value.split(os.pathsep)[1:]
        config.parameters["python_path"].string_value = os.pathsep.join([str(code_dir.resolve()), *rest])
        config_path.write_text(text_format.MessageToString(config))


async def main_async(args: argparse.Namespace) -> dict[str, list[RunResult]]:
    where = machine()
    config = EngineConfig(max_num_seqs=max(64, args.streams), num_blocks=2048)
    wanted = args.paths.split(",")
    if args.baseline_code is not None:
        wanted.append("triton-baseline")
    runs: dict[str, list[RunResult]] = {label: [] for label in ["in-process", *wanted] if label}
    servers: list[TritonProcess] = []
    upstreams: list[Upstream] = []
    with tempfile.TemporaryDirectory(prefix="bench-triton-") as tmp:
        model_dir = build_demo_model(Path(tmp) / "model")
        engine = LLMEngine.from_pretrained(model_dir, config)
        engine.start()

        async def triton(name: str, code: Path | None = None) -> TritonUpstream:
            repository = render_cpu_repository(Path(tmp) / name, model_dir, config)
            if code is not None:
                _with_model_code(repository, code)
            server = await asyncio.to_thread(start_local_triton, repository)
            servers.append(server)
            # end_id -1: TensorRT-LLM's "ignore the end token", so the output length is fixed here too.
            up = TritonUpstream(name, server.grpc_url, server.metrics_url, end_id=-1)
            upstreams.append(up)
            return up

        paths: dict[str, tuple[Generate, int | None]] = {
            "in-process": (upstream_generate(AsyncEngine(engine)), None)
        }
        try:
            if "triton" in runs or "triton-shared" in runs:
                upstream = await triton("bench")
                pid = servers[-1].process.pid
                if "triton" in runs:
                    paths["triton"] = (upstream_generate(upstream), pid)
                if "triton-shared" in runs:
                    # The measured alternative client (one synchronous stream per replica).
                    shared = SharedStreamUpstream(
                        TritonUpstream("bench-shared", upstream.grpc_url, upstream.metrics_url, end_id=-1)
                    )
                    upstreams.append(shared)
                    paths["triton-shared"] = (upstream_generate(shared), pid)
            if args.baseline_code is not None:
                baseline = await triton("baseline", args.baseline_code)
                paths["triton-baseline"] = (upstream_generate(baseline), servers[-1].process.pid)
            # Alternate the paths so a burst of load from elsewhere hits all alike.
            for _ in range(args.repeat):
                for label, (generate, replica_pid) in paths.items():
                    result = await run_load(
                        label, generate, args.streams, args.max_tokens, args.prompt_len, replica_pid
                    )
                    runs[label].append(result)
        finally:
            for up in upstreams:
                await up.aclose()
            for server in servers:
                await asyncio.to_thread(server.stop)
            engine.stop()
    report = render_report(runs, args, config, where)
    print(report)
    if args.doc:
        args.doc.write_text(report)
    return runs


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Triton vs in-process engine, same load.")
    parser.add_argument("--streams", type=int, default=100)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument(
        "--repeat", type=int, default=3, help="runs per path, alternating; the median is shown"
    )
    parser.add_argument("--doc", type=Path, help="write the Markdown report here")
    parser.add_argument(
        "--paths",
        default="triton,triton-shared",
        help="Triton paths beside in-process: triton, triton-shared",
    )
    parser.add_argument(
        "--baseline-code", type=Path, help="also run the CPU model from this checkout (triton-baseline)"
    )
    asyncio.run(main_async(parser.parse_args(argv)))


if __name__ == "__main__":
    main()
