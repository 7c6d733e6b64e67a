"""The GEMV/GEMM knee fixed at 16 rows (the engine before it measured its own) against the knee
the engine measures on this machine, in one run, the two interleaved (A B B A) so that a change in
the box's load falls on both alike:

1. decode tokens/s of 1, 4 and 16 streams (the engine alone, token budget), with the engine
   thread's CPU time per token beside the wall clock's figure;
2. a 500-token prompt joining 4 decoding streams with the default time budget (bench/engine.py's
   section 4): the streams' inter-token p99 against their steady gap and against the same streams
   with nothing joining, in CPU time too, and the prompt's TTFT.

    .venv/bin/python -m bench.engine_knee [--model DIR] [--tokens 48] [--join-tokens 500]
    .venv/bin/python -m bench.engine_knee --budgets 1.6:16,1.6:8 (the join alone at the measured
        knee, by prefill_slowdown:min_prefill_chunk[:prefill_lane], e.g. 1.6:4:off,1.6:4:on)
"""

from __future__ import annotations

import argparse
import os
import time
from datetime import UTC, datetime
from pathlib import Path

from msgspec.structs import replace

from bench.engine import SERVE_CONFIG, default_model, machine
from bench.engine_driver import Driver
from bench.engine_measures import JoinRun, long_prompt_joins
from gpu_container.engine.blas_threads import limit_blas_threads
from gpu_container.engine.gemv_knee import model_knee
from gpu_container.engine.loader import load_model
from gpu_container.engine.model import MAX_KNEE_ROWS, LlamaModel
from gpu_container.engine.types import EngineConfig, SamplingParams

STREAMS = (1, 4, 16)


def decode(model: LlamaModel, config: EngineConfig, streams: int, tokens: int) -> tuple[float, float]:
    """(tokens per wall second, tokens per second of the engine thread's CPU time)."""
    with Driver(model, replace(config, prefill_slowdown=0.0)) as driver:
        params = SamplingParams(max_new_tokens=tokens, temperature=0.0, ignore_eos=True)
        driver.closed_loop([1, 2, 3, 4], 1, SamplingParams(max_new_tokens=2, temperature=0.0), 1)  # warm-up
        start = time.perf_counter()
        got, wall = driver.closed_loop([1, 2, 3, 4], streams, params, streams)
        cpu = sum(driver.step_cpu_s(start, time.perf_counter()))
    return got / wall, got / cpu


def join_line(run: JoinRun) -> str:
    return (
        f"p99/steady {run.join_p99_s / run.steady_gap_s:.2f}, "
        f"p99/unjoined {run.join_p99_s / run.unjoined_gap_s:.2f}, "
        f"step CPU p99/steady {run.join_step_cpu_p99_s / run.steady_step_cpu_s:.2f}, "
        f"step CPU p99/unjoined median {run.join_step_cpu_p99_s / run.unjoined_step_cpu_s_median:.2f}, "
        f"p99 of gap/same gap unjoined {run.same_position_p99:.2f} (step CPU {run.same_step_cpu_p99:.2f}), "
        f"steady gap {run.steady_gap_s * 1e3:.0f} ms (CPU {run.steady_step_cpu_s * 1e3:.0f} ms, "
        f"p99 {run.steady_p99_s / run.steady_gap_s:.2f}x), "
        f"TTFT {run.ttft_s:.1f} s, load {run.load:.1f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.engine_knee")
    parser.add_argument("--model", type=Path, help="checkpoint directory (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--tokens", type=int, default=48, help="tokens each decoding stream generates")
    parser.add_argument("--join-tokens", type=int, default=500, help="0 skips the join")
    parser.add_argument("--joins", type=int, default=1, help="A B B A rounds of the join")
    parser.add_argument(
        "--budgets",
        default="",
        help="prefill_slowdown:min_prefill_chunk[:prefill_lane] to join with at the measured knee "
        "instead (e.g. 1.6:4:off,1.6:4:on): no decode runs",
    )
    args = parser.parse_args()
    model = load_model(args.model or default_model())
    limit_blas_threads(SERVE_CONFIG.blas_threads)
    start = time.thread_time()
    measured = model_knee(model, time.thread_time)
    took = time.thread_time() - start
    print(f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC; {machine()}", flush=True)
    print(f"measured knee {measured} rows ({took * 1e3:.0f} ms of CPU time to measure)", flush=True)
    if args.budgets:
        variants = {}
        for budget in args.budgets.split(","):
            slowdown, floor, *lane = budget.split(":")
            config = replace(
                SERVE_CONFIG,
                gemv_knee_rows=measured,
                prefill_slowdown=float(slowdown),
                min_prefill_chunk=int(floor),
                prefill_lane=lane[0] if lane else SERVE_CONFIG.prefill_lane,
            )
            label = f"measured knee {measured}, time {float(slowdown):g}x, floor {floor}"
            variants[label + (f", lane {lane[0]}" if lane else "")] = config
        for _ in range(args.joins):
            for label in [*variants, *reversed(variants)]:
                run = long_prompt_joins(model, variants[label], label, args.join_tokens, streams=4)
                print(f"join {args.join_tokens}, {label}: {join_line(run)}", flush=True)
        return
    knees = {"knee 16": MAX_KNEE_ROWS, f"measured knee {measured}": measured}
    configs = {label: replace(SERVE_CONFIG, gemv_knee_rows=k) for label, k in knees.items()}
    order = [*configs, *reversed(configs)]
    for streams in STREAMS:
        sums = {label: [0.0, 0.0] for label in configs}
        for label in order:
            wall, cpu = decode(model, configs[label], streams, args.tokens)
            sums[label][0] += wall / 2
            sums[label][1] += cpu / 2
        base = sums["knee 16"]
        for label, (wall, cpu) in sums.items():
            print(
                f"decode {streams:2d} streams, {label}: {wall:6.1f} tok/s wall ({wall / base[0]:.2f}x), "
                f"{cpu:6.1f} tok/s of CPU ({cpu / base[1]:.2f}x), load {os.getloadavg()[0]:.1f}",
                flush=True,
            )
    if args.join_tokens:
        for _ in range(args.joins):
            for label in order:
                run = long_prompt_joins(model, configs[label], label, args.join_tokens, streams=4)
                print(f"join {args.join_tokens}, {label}: {join_line(run)}", flush=True)


if __name__ == "__main__":
    main()
