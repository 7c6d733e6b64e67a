"""What sampling costs the CPU engine at a top_p below 1: the sampler before (exp in float64, the
whole vocabulary stable-sorted for every token) against gpu_container/engine/sampler.py's (exp in
float32, only the tokens near the most likely one sorted: `nucleus`), in one run, the two
interleaved (A B B A) so that a change in the box's load falls on both alike:

1. the sampler alone on real rows of logits (the real model's, caught from a served run at each
   temperature): µs per token, and how often the two draw the same token from the same seed;
2. the engine alone decoding 32 streams at each temperature with top_p 0.9 (the real model's
   served defaults are temperature 0.2, top_p 0.9): tokens/s, and the engine thread's CPU per
   token; greedy decoding beside them, the ceiling sampling can approach.

    .venv/bin/python -m bench.sampler [--model DIR] [--streams 32] [--tokens 48]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from unittest.mock import patch

import numpy as np

import gpu_container.engine.sampler as sampler_module
from bench.engine import MESSAGES, SERVE_CONFIG, default_model, machine
from bench.engine_driver import Driver
from edge.text.model_text import ModelText
from gpu_container.engine.blas_threads import limit_blas_threads
from gpu_container.engine.loader import load_model
from gpu_container.engine.model import LlamaModel
from gpu_container.engine.types import SamplingParams

Logits = np.ndarray[tuple[int], np.dtype[np.float32]]
Sampler = Callable[[Logits, SamplingParams, np.random.Generator], int]
TOP_P = 0.9
TEMPERATURES = (0.2, 0.7, 1.0)


def sample_before(logits: Logits, params: SamplingParams, rng: np.random.Generator, *_: object) -> int:
    """The engine's sampler before, for rows with no penalty, bias or min_tokens (as here)."""
    if params.temperature == 0 or rng is None:
        return int(np.argmax(logits))
    scaled = logits.astype(np.float64) / params.temperature
    probs = np.exp(scaled - scaled.max())
    order = np.argsort(-probs, kind="stable")
    cumulative = np.cumsum(probs[order])
    keep = int(np.searchsorted(cumulative, params.top_p * cumulative[-1])) + 1
    index = int(np.searchsorted(cumulative[:keep], rng.random() * cumulative[keep - 1], side="right"))
    return int(order[min(index, keep - 1)])


VARIANTS: dict[str, Sampler] = {"before": sample_before, "now": sampler_module.sample}


def engine_sampling_with(variant: Callable[..., int]) -> AbstractContextManager[object]:
    """The engine's steps sampling with `variant` (the engine looks `sample` up at each step)."""
    return patch("gpu_container.engine.engine.sample", variant)


def caught_rows(model: LlamaModel, prompt: list[int], temperature: float, count: int) -> list[Logits]:
    """`count` rows of the real model's logits, as the sampler receives them in a served run (several
    streams, sampling at `temperature`)."""
    rows: list[Logits] = []

    def catching(logits: Logits, *args: Any) -> int:
        if len(rows) < count:
            rows.append(logits.copy())
        return sampler_module.sample(logits, *args)

    params = SamplingParams(max_new_tokens=count // 8 + 1, temperature=temperature, top_p=TOP_P, seed=7)
    with engine_sampling_with(catching), Driver(model, SERVE_CONFIG) as driver:
        driver.closed_loop(prompt, 8, params, 8)
    return rows[:count]


def per_token_us(variant: Sampler, rows: list[Logits], temperature: float) -> tuple[float, list[int]]:
    params = SamplingParams(temperature=temperature, top_p=TOP_P)
    rng = np.random.default_rng(0)
    start = time.perf_counter()
    drawn = [variant(row, params, rng) for row in rows]
    return (time.perf_counter() - start) / len(rows) * 1e6, drawn


def decode(
    model: LlamaModel, prompt: list[int], temperature: float, streams: int, tokens: int
) -> tuple[float, float]:
    """(tokens per wall second, engine thread's CPU µs per token) for `streams` sampled streams."""
    with Driver(model, SERVE_CONFIG) as driver:
        params = SamplingParams(
            max_new_tokens=tokens, temperature=temperature, top_p=TOP_P, ignore_eos=True, seed=1
        )
        driver.closed_loop(prompt, 1, SamplingParams(max_new_tokens=2, temperature=0.0), 1)  # warm-up
        start = time.perf_counter()
        got, wall = driver.closed_loop(prompt, streams, params, streams)
        cpu = sum(driver.step_cpu_s(start, time.perf_counter()))
    return got / wall, cpu / got * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.sampler")
    parser.add_argument("--model", type=Path, help="checkpoint directory (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--streams", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=48, help="tokens each decoding stream generates")
    parser.add_argument("--rows", type=int, default=400, help="rows of logits per temperature")
    args = parser.parse_args()
    model_dir = args.model or default_model()
    model = load_model(model_dir)
    limit_blas_threads(SERVE_CONFIG.blas_threads)
    prompt = ModelText.load(model_dir).encode_chat(MESSAGES)
    print(f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC; {machine()}", flush=True)
    print(f"model {model_dir}, vocabulary {model.config.vocab_size}, top_p {TOP_P}", flush=True)
    names = list(VARIANTS)
    order = [*names, *reversed(names)]
    greedy = [decode(model, prompt, 0.0, args.streams, args.tokens)[0] for _ in range(2)]
    print(
        f"engine, {args.streams} streams, greedy (the ceiling: no sampling at all): "
        f"{statistics.mean(greedy):.1f} tokens/s",
        flush=True,
    )
    for temperature in TEMPERATURES:
        rows = caught_rows(model, prompt, temperature, args.rows)
        times: dict[str, list[float]] = {name: [] for name in names}
        drawn: dict[str, list[int]] = {}
        for name in order:
            us, drawn[name] = per_token_us(VARIANTS[name], rows, temperature)
            times[name].append(us)
        same = sum(a == b for a, b in zip(*drawn.values(), strict=True))
        before, now = (statistics.mean(times[name]) for name in names)
        print(
            f"sampler alone, temperature {temperature}: {before:.0f} µs -> {now:.0f} µs per token "
            f"({before / now:.1f}x); same token from the same seed {same}/{len(rows)}",
            flush=True,
        )
        rates: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
        for name in order:
            with engine_sampling_with(VARIANTS[name]):
                rates[name].append(decode(model, prompt, temperature, args.streams, args.tokens))
        (tps_before, cpu_before), (tps_now, cpu_now) = (
            (statistics.mean(r[0] for r in rates[name]), statistics.mean(r[1] for r in rates[name]))
            for name in names
        )
        print(
            f"engine, {args.streams} streams, temperature {temperature}: {tps_before:.1f} -> {tps_now:.1f} "
            f"tokens/s ({tps_now / tps_before:.2f}x); engine CPU {cpu_before:.0f} -> {cpu_now:.0f} µs/token",
            flush=True,
        )


if __name__ == "__main__":
    main()
