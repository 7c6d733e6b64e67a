"""The engine's own measurements for bench/engine.py: memory roofline, the layout/dtype/thread
choices, the prefill time budget, and continuous against static batching."""

from __future__ import annotations

import itertools
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
from msgspec.structs import replace
from threadpoolctl import threadpool_limits

from bench.engine_driver import Driver
from gpu_container.engine.arrays import Floats
from gpu_container.engine.forward_batch import ForwardBatch
from gpu_container.engine.kv_cache import KVCache
from gpu_container.engine.model import LlamaModel
from gpu_container.engine.scheduler import ScheduledChunk
from gpu_container.engine.sequence import Sequence
from gpu_container.engine.types import EngineConfig, SamplingParams


def cpu_time_of(fn: Callable[[], object], repeats: int) -> float:
    """Median CPU time of the calling thread over `repeats` calls, after a warm-up call.

    CPU time, not wall time: on a shared box the wall clock also counts the time other processes
    held the core. With one BLAS thread all the work runs on this thread, so this is the time the
    call takes when it has a core to itself."""
    fn()  # warm-up: page faults, BLAS buffers
    times = []
    for _ in range(repeats):
        start = time.thread_time()
        fn()
        times.append(time.thread_time() - start)
    return statistics.median(times)


@dataclass(frozen=True)
class Roofline:
    threads: int
    weight_bytes: int
    step_s: float  # batch-1 decode step (forward + argmax): thread CPU time at 1 thread, best wall at 2
    step_wall_s: float  # median wall-clock step: what a shared box inflates
    copy_bytes_per_s: float  # numpy copy, timed the same way, interleaved with the steps
    clock: str

    @property
    def bytes_per_s(self) -> float:
        return self.weight_bytes / self.step_s

    @property
    def fraction(self) -> float:
        return self.bytes_per_s / self.copy_bytes_per_s


def decode_roofline(model: LlamaModel, threads: int, repeats: int) -> Roofline:
    """Batch-1 decode steps (one sequence, 64 tokens of context) interleaved with copies of an array
    the size of the weights, so both see the same machine. The copy counts each byte once, as the
    issue states copy bandwidth."""
    cfg = model.config
    cache = KVCache.allocate(cfg.num_hidden_layers, 8, 16, cfg.num_key_value_heads, cfg.head_dim)
    seq = Sequence("roofline", list(range(1, 65)), SamplingParams(), lambda _: None)
    seq.block_table, seq.num_computed_tokens = list(range(4)), 63
    batch = ForwardBatch.from_chunks([ScheduledChunk(seq, 1)], 16)
    src = np.ones(model.weights.nbytes // 4, dtype=np.float32)
    dst = np.empty_like(src)
    clock = time.thread_time if threads == 1 else time.perf_counter
    steps, walls, copies = [], [], []
    with threadpool_limits(threads, "blas"):
        np.copyto(dst, src)
        np.argmax(model.forward(batch, cache)[0])  # warm-up
        for _ in range(repeats):
            start = clock()
            np.copyto(dst, src)
            copies.append(clock() - start)
            start, wall = clock(), time.perf_counter()
            np.argmax(model.forward(batch, cache)[0])
            steps.append(clock() - start)
            walls.append(time.perf_counter() - wall)
    pick = statistics.median if threads == 1 else min
    return Roofline(
        threads,
        model.weights.nbytes,
        pick(steps),
        statistics.median(walls),
        src.nbytes / pick(copies),
        "thread CPU time, median" if threads == 1 else "wall time, best of the run",
    )


def decode_throughput(
    model: LlamaModel, config: EngineConfig, threads: int, streams: int, tokens: int
) -> float:
    """Tokens/s of `streams` sequences decoding together (the engine alone)."""
    with Driver(model, replace(config, blas_threads=threads, prefill_slowdown=0.0)) as driver:
        params = SamplingParams(max_new_tokens=tokens, temperature=0.0, ignore_eos=True)
        got, wall = driver.closed_loop([1, 2, 3, 4], streams, params, streams)
    return got / wall


@dataclass(frozen=True)
class LayoutRow:
    rows: int
    nn_gemm_ms: float  # x @ W, W stored [in, out] (what the engine keeps)
    row_gemv_ms: float  # one GEMV per row against the same W
    nt_gemm_ms: float  # x @ W.T, W stored [out, in] (the checkpoint's layout)
    fp16_ms: float  # x @ W with W stored float16 (numpy has no fp16 BLAS)


def layout_table(model: LlamaModel, rows: tuple[int, ...]) -> list[LayoutRow]:
    """Every layer's gate|up projection (too big for the cache together), one product each, in
    thread CPU time at one BLAS thread."""
    with threadpool_limits(1, "blas"):
        return _layout_table(model, rows)


def _layout_table(model: LlamaModel, rows: tuple[int, ...]) -> list[LayoutRow]:
    mats = [layer.gate_up_proj for layer in model.weights.layers]
    transposed = [np.ascontiguousarray(w.T) for w in mats]
    half = [w.astype(np.float16) for w in mats[:1]]  # 1 of 30, scaled: fp16 is far slower
    table = []
    for m in rows:
        x = np.random.default_rng(0).standard_normal((m, mats[0].shape[0])).astype(np.float32)
        xh = x.astype(np.float16)

        def gemm(x: Floats = x) -> None:
            for w in mats:
                x @ w

        def per_row(x: Floats = x) -> None:
            for w in mats:
                for r in x:
                    r @ w

        def transposed_gemm(x: Floats = x) -> None:
            for w in transposed:
                x @ w.T

        def half_gemm(xh: npt.NDArray[np.float16] = xh) -> None:
            for w in half:
                xh @ w

        nn, rg, nt = cpu_time_of(gemm, 3), cpu_time_of(per_row, 3), cpu_time_of(transposed_gemm, 3)
        f16 = cpu_time_of(half_gemm, 1) * len(mats) / len(half) if m <= 16 else float("nan")
        table.append(LayoutRow(m, nn * 1e3, rg * 1e3, nt * 1e3, f16 * 1e3))
    return table


@dataclass(frozen=True)
class HeadRow:
    rows: int
    embed_t_ms: float  # x @ E.T, E the [vocab, hidden] embedding: the head as a view of it (before)
    copy_ms: float  # x @ H, H the contiguous [hidden, vocab] head the engine keeps (E its transpose)


def head_table(model: LlamaModel, rows: tuple[int, ...]) -> list[HeadRow]:
    with threadpool_limits(1, "blas"):
        return _head_table(model, rows)


def _head_table(model: LlamaModel, rows: tuple[int, ...]) -> list[HeadRow]:
    copy = model.weights.lm_head
    embed = np.ascontiguousarray(copy.T)
    table = []
    for m in rows:
        x = np.ones((m, embed.shape[1]), dtype=np.float32)

        def view(x: Floats = x) -> None:
            x @ embed.T

        def copied(x: Floats = x) -> None:
            x @ copy

        table.append(HeadRow(m, cpu_time_of(view, 3) * 1e3, cpu_time_of(copied, 3) * 1e3))
    return table


@dataclass(frozen=True)
class ChunkCost:
    """A step of 4 decodes carrying one prefill chunk (256 tokens of context before it)."""

    chunk: int
    step_s: float
    decode_step_s: float  # the same 4 decodes alone

    @property
    def per_token_s(self) -> float:
        return (self.step_s - self.decode_step_s) / self.chunk


def chunk_costs(model: LlamaModel, chunks: tuple[int, ...], decodes: int = 4) -> list[ChunkCost]:
    """What a prompt token costs by chunk size, next to `decodes` decodes: where the per-token cost
    flattens out is where [engine] min_prefill_chunk sits. Thread CPU time at one BLAS thread."""
    cfg = model.config
    cache = KVCache.allocate(cfg.num_hidden_layers, 160, 16, cfg.num_key_value_heads, cfg.head_dim)

    def seq(i: int, computed: int, total: int, first_block: int) -> Sequence:
        s = Sequence(f"cost-{i}", [5] * total, SamplingParams(), lambda _: None)
        s.block_table = list(range(first_block, first_block - (-total // 16)))
        s.num_computed_tokens = computed
        return s

    def decoding() -> list[ScheduledChunk]:
        return [ScheduledChunk(seq(i, 64, 65, i * 8), 1) for i in range(decodes)]

    def step(chunks: list[ScheduledChunk]) -> Callable[[], object]:
        batch = ForwardBatch.from_chunks(chunks, 16)
        return lambda: model.forward(batch, cache)

    with threadpool_limits(1, "blas"):
        alone = cpu_time_of(step(decoding()), 3)
        return [
            ChunkCost(
                n, cpu_time_of(step([*decoding(), ScheduledChunk(seq(99, 256, 256 + n, 40), n)]), 3), alone
            )
            for n in chunks
        ]


@dataclass(frozen=True)
class JoinRun:
    """Streams decoding while a long prompt joins: their gaps before and while it prefills, and the
    same streams' gaps at the same token positions in a run where nothing joins."""

    label: str
    prompt_tokens: int
    steady_gap_s: float  # median inter-token time before the prompt arrived
    steady_p99_s: float  # their p99 then: the noise floor of this machine
    join_gaps_s: list[float]  # the streams' inter-token times while it prefilled
    ttft_s: float  # the long prompt's time to first token
    gaps_timeline: list[tuple[float, float]]  # (seconds since the join, gap) of one stream
    steady_step_cpu_s: float = float("nan")  # median engine-thread CPU time of a step before it
    join_step_cpu_s: list[float] = field(default_factory=list)  # each step's while it prefilled
    load: float = float("nan")  # 1-minute load average when the run ended
    # The same streams' gaps at the same token positions, and the engine's steps meanwhile, run
    # right after without the prompt: their decode step grows with their own context (attention
    # over it), which the steady gap before the join does not see.
    unjoined_gaps_s: list[float] = field(default_factory=list)
    unjoined_step_cpu_s: list[float] = field(default_factory=list)

    @property
    def join_step_cpu_p99_s(self) -> float:
        return float(np.percentile(self.join_step_cpu_s, 99)) if self.join_step_cpu_s else float("nan")

    @property
    def join_p99_s(self) -> float:
        return float(np.percentile(self.join_gaps_s, 99)) if self.join_gaps_s else float("nan")

    @property
    def unjoined_gap_s(self) -> float:
        return statistics.median(self.unjoined_gaps_s) if self.unjoined_gaps_s else float("nan")

    @property
    def unjoined_step_cpu_s_median(self) -> float:
        return statistics.median(self.unjoined_step_cpu_s) if self.unjoined_step_cpu_s else float("nan")

    @property
    def same_position_p99(self) -> float:
        """p99 of each gap over the same stream's gap at the same position with nothing joining:
        a long join lets the streams' contexts grow, and their decode step with them, which a p99
        over the whole window against one median counts as the join's doing."""
        return _ratio_p99(self.join_gaps_s, self.unjoined_gaps_s)

    @property
    def same_step_cpu_p99(self) -> float:
        """The same for the engine's steps, in CPU time (the n-th step of each window)."""
        return _ratio_p99(self.join_step_cpu_s, self.unjoined_step_cpu_s)


def _ratio_p99(joined: list[float], unjoined: list[float]) -> float:
    pairs = [a / b for a, b in zip(joined, unjoined, strict=False) if b > 0]
    return float(np.percentile(pairs, 99)) if pairs else float("nan")


_STEADY_FROM, _STEADY_TO = 8, 40  # the streams' tokens between which the steady gap is measured


def _start_streams(driver: Driver, streams: int) -> None:
    forever = SamplingParams(max_new_tokens=100_000, temperature=0.0, ignore_eos=True)
    for i in range(streams):
        driver.add(f"stream-{i}", [1, 2, 3, 4 + i], forever)


def long_prompt_joins(
    model: LlamaModel, config: EngineConfig, label: str, prompt_tokens: int, streams: int
) -> JoinRun:
    """The join, then the same streams alone in a fresh engine up to the same token positions."""
    rng = np.random.default_rng(prompt_tokens)
    names = [f"stream-{i}" for i in range(streams)]
    with threadpool_limits(config.blas_threads, "blas"), Driver(model, config) as driver:
        _start_streams(driver, streams)
        for name in names:
            driver.wait_tokens(name, _STEADY_FROM)
        steady_from = {name: len(driver.traces[name].times) for name in names}
        driver.wait_tokens("stream-0", _STEADY_TO)
        steady = [g for name in names for g in driver.traces[name].gaps[steady_from[name] :]]
        steady_times = driver.traces["stream-0"].times
        steady_cpu = driver.step_cpu_s(steady_times[steady_from["stream-0"]], steady_times[-1])
        prompt = [int(t) for t in rng.integers(3, model.config.vocab_size, prompt_tokens)]
        driver.add("long", prompt, SamplingParams(max_new_tokens=1, temperature=0.0))
        driver.wait("long")
        joined, first = driver.traces["long"].sent, driver.traces["long"].times[0]
        gaps: list[float] = []
        timeline: list[tuple[float, float]] = []
        # Per stream, the gaps that ended while the prompt joined, by the index of their first token.
        positions: dict[str, list[int]] = {name: [] for name in names}
        for name in names:
            times = driver.traces[name].times
            for k, (a, b) in enumerate(itertools.pairwise(times)):
                if b > joined and a < first:
                    gaps.append(b - a)
                    positions[name].append(k)
                    if name == "stream-0":
                        timeline.append((b - joined, b - a))
        join_cpu = driver.step_cpu_s(joined, first)
        for name in names:
            driver.engine.abort(name)
    unjoined, unjoined_cpu = _unjoined(model, config, positions)
    return JoinRun(
        label,
        prompt_tokens,
        statistics.median(steady),
        float(np.percentile(steady, 99)),
        gaps,
        first - joined,
        timeline,
        statistics.median(steady_cpu),
        join_cpu,
        os.getloadavg()[0],
        unjoined,
        unjoined_cpu,
    )


def _unjoined(
    model: LlamaModel, config: EngineConfig, positions: dict[str, list[int]]
) -> tuple[list[float], list[float]]:
    """The streams alone, same prompts and config: their gaps at `positions` and the engine's steps
    between the first and the last of them."""
    with threadpool_limits(config.blas_threads, "blas"), Driver(model, config) as driver:
        _start_streams(driver, len(positions))
        for name, ks in positions.items():
            driver.wait_tokens(name, max(ks, default=0) + 2)
        gaps = [driver.traces[name].gaps[k] for name, ks in positions.items() for k in ks]
        ks = positions["stream-0"]
        times = driver.traces["stream-0"].times
        cpu = driver.step_cpu_s(times[ks[0]], times[ks[-1] + 1]) if ks else []
        for name in positions:
            driver.engine.abort(name)
    return gaps, cpu


@dataclass(frozen=True)
class BatchingRun:
    mode: str
    requests: int
    tokens: int
    wall_s: float

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s


def heavy_tailed_lengths(count: int, seed: int = 7) -> list[int]:
    """Reply lengths from a Pareto tail (shape 1.2, at least 8 tokens, capped at 160): most replies
    are short, a few run long, as chat replies do."""
    rng = np.random.default_rng(seed)
    return [int(min(160, 8 * (1 + rng.pareto(1.2)))) for _ in range(count)]


def batching_run(model: LlamaModel, config: EngineConfig, lengths: list[int]) -> BatchingRun:
    """Every request submitted at once; tokens/s until the last one ends."""
    with threadpool_limits(config.blas_threads, "blas"), Driver(model, config) as driver:
        start = time.perf_counter()
        for i, n in enumerate(lengths):
            driver.add(
                f"r{i}",
                [1, 2, 3, 4 + i % 50],
                SamplingParams(max_new_tokens=n, temperature=0.0, ignore_eos=True),
            )
        driver.wait(*(f"r{i}" for i in range(len(lengths))))
        wall = time.perf_counter() - start
        tokens = sum(t.tokens for t in driver.traces.values())
    return BatchingRun(config.batching, len(lengths), tokens, wall)
