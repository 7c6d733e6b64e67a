"""What the prefill lane's piece size buys a paid prompt that arrives while a free one prefills, and
what it costs the free prompt, the decoding streams and the CPU (prefill_lane.py, `[engine]
lane_piece_tokens`): the options side by side in one run, alternated (A B C, C B A, ...), so that a
change in the box's load falls on every option alike.

Why: the scheduler holds the lane's sequences, so a prompt that outranks the lane's waits until the
lane ends its work. With pieces the lane ends it between two forwards; a piece as large as the
lane's chunk (512, max_num_batched_tokens) is one forward a chunk, as the lane ran before 33a5b33,
and the paid prompt waited for all of it. Smaller pieces or chunks shorten that wait for a little
more CPU a token.

Each run is a fresh engine (prefill_lane "on", the served [engine] settings otherwise, the GEMV knee
measured once here and set on every option) with N streams decoding greedy; once each stream has
its first 10 tokens a free (priority 0) prompt of --free-tokens random tokens goes in, --delay
seconds later a paid (priority 1) one of --paid-tokens. Reported per run, and per option and stream
count as medians over the rounds: the paid prompt's TTFT and the free one's; the prefill's CPU (the
thread CPU time of every forward that carries prompt rows: the machine's load moves it far less
than the wall clock); the streams' inter-token gaps (one per engine output) from the free prompt's
arrival to its first token, p50 / p90 / p99 / max, beside their p50 before it; and whether the paid
prompt went in while the free one was still prefilling (no first token yet), without which a run
measures nothing.

--costs adds what pieces cost by themselves: one prompt's 512 rows at a few contexts as one forward
against pieces of each size in sequence, thread CPU time, best of 2.

    .venv/bin/python -m bench.lane_priority [--model DIR] [--pieces 512,256,128] [--chunks 128]
        [--streams 0,3] [--rounds 3] [--costs 0,1280] [--json] [--quick]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from msgspec.structs import replace

from bench.engine import SERVE_CONFIG, default_model, machine
from bench.engine_driver import Driver
from gpu_container.engine.arrays import Floats
from gpu_container.engine.blas_threads import limit_blas_threads
from gpu_container.engine.forward_batch import ForwardBatch
from gpu_container.engine.gemv_knee import model_knee
from gpu_container.engine.kv_cache import KVCache
from gpu_container.engine.loader import load_model
from gpu_container.engine.model import LlamaModel
from gpu_container.engine.scheduler import ScheduledChunk
from gpu_container.engine.sequence import Sequence
from gpu_container.engine.types import EngineConfig, SamplingParams

STEADY_TOKENS = 10  # each stream's tokens before the prompts go in
STREAM = SamplingParams(max_new_tokens=3000, temperature=0.0, ignore_eos=True)
PROMPT = SamplingParams(max_new_tokens=2, temperature=0.0, ignore_eos=True)
COST_ROWS = 512


class TimedModel(LlamaModel):
    """The model, adding up the thread CPU time of each forward that carries prompt rows (more rows
    than sequences): on the lane's thread with a lane, whatever the other thread does meanwhile."""

    def __init__(self, model: LlamaModel) -> None:
        super().__init__(model.config, model.weights)
        self.knee_rows = model.knee_rows
        self.prefill_cpu_s = 0.0

    def forward(self, batch: ForwardBatch, cache: KVCache) -> Floats:
        start = time.thread_time()
        try:
            return super().forward(batch, cache)
        finally:
            if len(batch.token_ids) > len(batch.slices):
                self.prefill_cpu_s += time.thread_time() - start


@dataclass
class Run:
    option: str
    streams: int
    round: int
    paid_ttft_s: float
    free_ttft_s: float
    prefill_cpu_s: float
    # The paid prompt went in while the free one had no token yet, this long after it.
    paid_sent_during_free_prefill: bool
    paid_sent_after_s: float
    paid_first: bool  # the paid prompt's first token came before the free one's
    gaps: int  # the streams' gaps counted below (none without streams)
    gap_p50_ms: float | None
    gap_p90_ms: float | None
    gap_p99_ms: float | None
    gap_max_ms: float | None
    steady_gap_p50_ms: float | None
    load: float


def options(pieces: str, chunks: str) -> dict[str, tuple[str, int]]:
    """label -> ("pieces" | "chunks", size)."""
    out: dict[str, tuple[str, int]] = {}
    for size in (int(s) for s in pieces.split(",") if s):
        whole = " (one forward a chunk)" if size >= SERVE_CONFIG.max_num_batched_tokens else ""
        out[f"pieces of {size}{whole}"] = ("pieces", size)
    for size in (int(s) for s in chunks.split(",") if s):
        out[f"chunks of {size}"] = ("chunks", size)
    return out


def config_for(kind: str, size: int, streams: int, knee: int) -> EngineConfig:
    """The served settings with a lane; chunks of `size`: a step's budget of `size` prompt tokens
    beside the streams' decodes (max_num_batched_tokens = size + streams), one piece each."""
    base = replace(SERVE_CONFIG, prefill_lane="on", prefill_slowdown=0.0, gemv_knee_rows=knee, max_num_seqs=8)
    if kind == "pieces":
        return replace(base, lane_piece_tokens=size)
    budget = max(size + streams, base.max_num_seqs)
    return replace(base, max_num_batched_tokens=budget, lane_piece_tokens=size)


def percentile_ms(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)) * 1e3, 1) if values else None


def one_run(
    model: TimedModel,
    config: EngineConfig,
    label: str,
    streams: int,
    round_: int,
    prompts: tuple[list[int], list[int]],
    delay: float,
) -> Run:
    free, paid = prompts
    names = [f"s{i}" for i in range(streams)]
    with Driver(model, config) as driver:
        for i, name in enumerate(names):
            driver.add(name, [(7 * j + i) % 900 + 3 for j in range(20 + i)], STREAM)
        for name in names:
            driver.wait_tokens(name, STEADY_TOKENS)
        steady_from = time.perf_counter()
        model.prefill_cpu_s = 0.0
        driver.add("free", free, PROMPT, priority=0)
        time.sleep(delay)
        during = not driver.traces["free"].times
        driver.add("paid", paid, PROMPT, priority=1)
        driver.wait("free", "paid")
        for name in names:
            driver.engine.abort(name)
        driver.wait(*names)
        prefill_cpu = model.prefill_cpu_s
    traces = driver.traces
    t0, t1 = traces["free"].sent, traces["free"].times[0]
    gaps: list[float] = []
    steady: list[float] = []
    for name in names:
        times = traces[name].times
        for a, b in itertools.pairwise(times):
            if b > t0 and a < t1:
                gaps.append(b - a)
            elif b < t0 and a >= steady_from - 1.0:
                steady.append(b - a)
    return Run(
        option=label,
        streams=streams,
        round=round_,
        paid_ttft_s=round(traces["paid"].ttft, 4),
        free_ttft_s=round(traces["free"].ttft, 4),
        prefill_cpu_s=round(prefill_cpu, 4),
        paid_sent_during_free_prefill=during,
        paid_sent_after_s=round(traces["paid"].sent - t0, 3),
        paid_first=traces["paid"].times[0] < t1,
        gaps=len(gaps),
        gap_p50_ms=percentile_ms(gaps, 50),
        gap_p90_ms=percentile_ms(gaps, 90),
        gap_p99_ms=percentile_ms(gaps, 99),
        gap_max_ms=round(max(gaps) * 1e3, 1) if gaps else None,
        steady_gap_p50_ms=percentile_ms(steady, 50),
        load=round(os.getloadavg()[0], 2),
    )


MEDIANS = (
    "paid_ttft_s",
    "free_ttft_s",
    "prefill_cpu_s",
    "gap_p50_ms",
    "gap_p90_ms",
    "gap_p99_ms",
    "gap_max_ms",
    "steady_gap_p50_ms",
)


def summarize(runs: list[Run], labels: list[str], stream_counts: list[int]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for streams in stream_counts:
        for label in labels:
            mine = [r for r in runs if r.option == label and r.streams == streams]
            row: dict[str, Any] = {"option": label, "streams": streams, "rounds": len(mine)}
            for key in MEDIANS:
                values = [v for r in mine if (v := getattr(r, key)) is not None]
                row[key] = round(statistics.median(values), 4) if values else None
            for key in ("paid_ttft_s", "free_ttft_s"):
                values = [getattr(r, key) for r in mine]
                row[key.removesuffix("_s") + "_range_s"] = [min(values), max(values)]
            row["paid_sent_during_free_prefill"] = all(r.paid_sent_during_free_prefill for r in mine)
            row["load"] = [min(r.load for r in mine), max(r.load for r in mine)]
            rows.append(row)
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value:.0f}"

    lines = [
        "| streams | option | paid TTFT | free TTFT | prefill CPU | gaps p50 / p90 / p99 / max "
        "(before: p50) | load |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        paid, free = r["paid_ttft_range_s"], r["free_ttft_range_s"]
        gaps = "-"
        if r["gap_p50_ms"] is not None:
            gaps = (
                f"{ms(r['gap_p50_ms'])} / {ms(r['gap_p90_ms'])} / {ms(r['gap_p99_ms'])} / "
                f"{ms(r['gap_max_ms'])} ms ({ms(r['steady_gap_p50_ms'])})"
            )
        warn = "" if r["paid_sent_during_free_prefill"] else " (paid sent after the free prompt's TTFT!)"
        lines.append(
            f"| {r['streams']} | {r['option']}{warn} "
            f"| {r['paid_ttft_s']:.2f} s ({paid[0]:.2f}-{paid[1]:.2f}) "
            f"| {r['free_ttft_s']:.2f} s ({free[0]:.2f}-{free[1]:.2f}) | {r['prefill_cpu_s']:.2f} s "
            f"| {gaps} | {r['load'][0]:.1f}-{r['load'][1]:.1f} |"
        )
    return "\n".join(lines)


def piece_costs(model: LlamaModel, contexts: list[int], sizes: list[int]) -> list[dict[str, Any]]:
    """512 rows of one prompt after `context` computed ones: one forward against pieces in sequence,
    the CPU time of this thread, best of 2 (bench's own cache: no engine)."""
    block = SERVE_CONFIG.block_size
    cfg = model.config
    total = max(contexts) + COST_ROWS
    blocks = -(-total // block)
    cache = KVCache.allocate(cfg.num_hidden_layers, blocks, block, cfg.num_key_value_heads, cfg.head_dim)
    seq = Sequence("cost", [(i * 7) % 900 + 3 for i in range(total)], PROMPT, lambda _: None)
    seq.block_table = list(range(blocks))

    def cpu(context: int, piece: int) -> float:
        start = time.thread_time()
        done = 0
        while done < COST_ROWS:
            n = min(piece, COST_ROWS - done)
            seq.num_computed_tokens = context + done
            model.forward(ForwardBatch.from_chunks([ScheduledChunk(seq, n)], block), cache)
            done += n
        return time.thread_time() - start

    rows = []
    for context in contexts:
        row: dict[str, Any] = {"context": context}
        for piece in sizes:
            row[f"pieces_of_{piece}_cpu_s"] = round(min(cpu(context, piece) for _ in range(2)), 3)
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.lane_priority")
    parser.add_argument("--model", type=Path, help="checkpoint directory (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--pieces", default=None, help="lane_piece_tokens to compare (default 512,256,128)")
    parser.add_argument(
        "--chunks",
        default=None,
        help="lane chunks of this many tokens (max_num_batched_tokens = it + streams) to compare "
        "too (default 128; '' for none)",
    )
    parser.add_argument("--streams", default=None, help="decoding streams beside the prompts (default 0,3)")
    parser.add_argument("--rounds", type=int, default=None, help="runs of every option (default 3)")
    parser.add_argument("--free-tokens", type=int, default=None, help="the free prompt (default 1800)")
    parser.add_argument("--paid-tokens", type=int, default=50)
    parser.add_argument("--delay", type=float, default=1.0, help="seconds from the free prompt to the paid")
    parser.add_argument(
        "--costs",
        default=None,
        help="contexts at which to time 512 rows as one forward against pieces (default 0,1280; '' for none)",
    )
    parser.add_argument("--json", action="store_true", help="one JSON object a line")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run: pieces 512,128, no chunks, 0 and 1 streams, 1 round, a 600-token free prompt, "
        "costs at context 0 (each unless given)",
    )
    args = parser.parse_args()
    quick = args.quick
    pieces = args.pieces if args.pieces is not None else ("512,128" if quick else "512,256,128")
    chunks = args.chunks if args.chunks is not None else ("" if quick else "128")
    stream_counts = [int(s) for s in (args.streams or ("0,1" if quick else "0,3")).split(",")]
    rounds = args.rounds or (1 if quick else 3)
    free_tokens = args.free_tokens or (600 if quick else 1800)
    costs = args.costs if args.costs is not None else ("0" if quick else "0,1280")

    def emit(kind: str, row: dict[str, Any], text: str) -> None:
        print(json.dumps({"kind": kind, **row}) if args.json else text, flush=True)

    model_dir = args.model or default_model()
    base = load_model(model_dir)
    limit_blas_threads(SERVE_CONFIG.blas_threads)
    knee = model_knee(base, time.thread_time)
    base.knee_rows = knee
    model = TimedModel(base)
    variants = options(pieces, chunks)
    setup = {
        "date": f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC",
        "machine": machine(),
        "model": str(model_dir),
        "knee_rows": knee,
        "free_tokens": free_tokens,
        "paid_tokens": args.paid_tokens,
        "delay_s": args.delay,
        "rounds": rounds,
        "options": list(variants),
        "streams": stream_counts,
    }
    emit("setup", setup, "\n".join(f"{k}: {v}" for k, v in setup.items()))
    started = time.time()
    vocab = model.config.vocab_size
    runs: list[Run] = []
    for round_ in range(rounds):
        rng = np.random.default_rng(round_)
        prompts = (
            [int(t) for t in rng.integers(3, vocab, free_tokens)],
            [int(t) for t in rng.integers(3, vocab, args.paid_tokens)],
        )
        order = list(variants) if round_ % 2 == 0 else list(reversed(variants))
        for streams in stream_counts:
            for label in order:
                kind, size = variants[label]
                config = config_for(kind, size, streams, knee)
                run = one_run(model, config, label, streams, round_ + 1, prompts, args.delay)
                runs.append(run)
                emit(
                    "run",
                    asdict(run),
                    f"round {run.round}, {streams} streams, {label}: paid TTFT {run.paid_ttft_s:.2f} s, "
                    f"free TTFT {run.free_ttft_s:.2f} s, prefill CPU {run.prefill_cpu_s:.2f} s, "
                    f"gaps p50/p99 {run.gap_p50_ms} / {run.gap_p99_ms} ms, "
                    f"paid sent during the free prefill: {run.paid_sent_during_free_prefill}, "
                    f"load {run.load:.1f}",
                )
    rows = summarize(runs, list(variants), stream_counts)
    if args.json:
        for row in rows:
            emit("summary", row, "")
    else:
        print(f"\nmedians over {rounds} round(s), with the range:\n{table(rows)}", flush=True)
    if costs:
        sizes = {SERVE_CONFIG.max_num_batched_tokens, *(s for _, s in variants.values())}
        for row in piece_costs(base, [int(c) for c in costs.split(",")], sorted(sizes, reverse=True)):
            text = f"context {row['context']}: " + ", ".join(
                f"{k.removesuffix('_cpu_s').replace('_', ' ')} {v:.2f} s"
                for k, v in row.items()
                if k != "context"
            )
            emit("piece_cost", row, text)
    emit(
        "done",
        {"minutes": round((time.time() - started) / 60, 1), "load": os.getloadavg()[0]},
        f"took {(time.time() - started) / 60:.1f} min; load average {os.getloadavg()}",
    )


if __name__ == "__main__":
    main()
