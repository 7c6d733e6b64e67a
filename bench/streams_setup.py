"""Set-up CPU per stream of several checkouts, side by side: alternating bursts, CPU in nanoseconds.

python -m bench.streams_setup --trees before=/path/to/old/checkout,after=. [--rounds 16]
                              [--count 600] [--bare] [--prompts same,new] [--limiter memory,redis]

The set-up column of `bench.streams` (a burst of one-token streams, server CPU / streams) with
what its side-by-side mode leaves to chance narrowed down, for comparing changes of a few percent
on a shared machine: every tree's server runs at once (`bench.streams` servers, `--replicas 0`
pacing), the bursts alternate between them and the order flips every round (neither is always
first after a pause); the CPU, as there, the servers' CPU clocks in nanoseconds (`Servers.cpu_ns`),
not /proc's 10 ms ticks (±2–3 % of a 600-stream burst). Printed: every burst, then per tree the
median, the minimum and the median ratio to the first tree over the rounds, and in how many rounds
it was the lower; `--json` adds every figure.
`--bare` adds a row "bare": bench/bare_sse_server.py, the same uvicorn protocol answering the same
request with the same bytes and none of the edge's work, the floor under the edge's figure.
`--prompts`: "same" (every stream sends one prompt, as an app's users send its system prompt) and
"new" (every stream a prompt no stream sent before: the edge keeps no piece of it,
edge/text/piece_cache.py); with both, each tree has a row of each, "LABEL new-prompts" the second.
`--limiter`: "memory" (the in-process twin) and/or "redis" (each tree's server on a redis-server
of its own, production's backend: the admit's and the settle's round trips are part of a stream's
set-up there); with both, "LABEL redis" rows beside the twin's, in the same alternating rounds.
The servers' CPU only: with `--json` a Redis row also gives its redis-server's CPU per stream
(`store_all`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
from pathlib import Path

from bench.__main__ import machine
from bench.names import names_of
from bench.streams import bare_server, edge_servers, setup_cost
from bench.trees import parse_trees


def measure(
    trees: list[tuple[str, Path | None]],
    rounds: int,
    count: int,
    bare: bool = False,
    prompts: tuple[str, ...] = ("same",),
    limiters: tuple[str, ...] = ("memory",),
    store: dict[str, list[float]] | None = None,
) -> dict[str, list[float]]:
    """ms of server CPU per one-token stream, per tree, limiter and prompt kind (and "bare"), one
    figure per round. `store`, when given, receives the Redis rows' redis-server CPU alike."""
    with contextlib.ExitStack() as stack:
        started = [
            (
                label if limiter == "memory" else f"{label} {limiter}",
                stack.enter_context(edge_servers(limiter, 33, 1, 32, "quiet", tree, "in-process")),
            )
            for label, tree in trees
            for limiter in limiters
        ]
        if bare:
            started.append(("bare", stack.enter_context(bare_server())))
        runs = [
            (label if kind == "same" else f"{label} new-prompts", kind == "new", server)
            for label, server in started
            for kind in (("same",) if label == "bare" else prompts)
        ]
        figures: dict[str, list[float]] = {label: [] for label, _, _ in runs}
        for r in range(rounds):
            for label, new_prompts, srv in runs if r % 2 == 0 else runs[::-1]:
                store_before = srv.cpu_ns(store=True)
                cpu_s, errors = asyncio.run(setup_cost(srv, 32, count, new_prompts))
                if errors:
                    raise RuntimeError(f"{label}: {errors} streams failed")
                figures[label].append(cpu_s * 1e3)
                if store is not None and srv.store_pids:
                    store.setdefault(label, []).append((srv.cpu_ns(store=True) - store_before) / count / 1e6)
            print(r, {label: round(v[-1], 3) for label, v in figures.items()}, flush=True)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.streams_setup")
    parser.add_argument("--trees", required=True, help="LABEL=DIR,...: the first is the reference")
    parser.add_argument("--rounds", type=int, default=16)
    parser.add_argument("--count", type=int, default=600, help="one-token streams per burst")
    parser.add_argument("--bare", action="store_true", help="add bench/bare_sse_server.py as a row")
    parser.add_argument(
        "--prompts",
        default="same",
        type=names_of(("same", "new")),
        help="same (one prompt for every stream, as a system prompt) and/or new (a prompt no stream "
        "sent before), comma-separated: a row of each per tree",
    )
    parser.add_argument(
        "--limiter",
        default="memory",
        type=names_of(("memory", "redis")),
        help="memory (the in-process twin) and/or redis (a redis-server per server), comma-separated",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    trees = parse_trees(args.trees)
    print(f"machine: {machine()}; load average before: {os.getloadavg()}", flush=True)
    prompts = tuple(args.prompts.split(","))
    limiters = tuple(args.limiter.split(","))
    store: dict[str, list[float]] = {}
    figures = measure(trees, args.rounds, args.count, args.bare, prompts, limiters, store)
    print(f"load average after: {os.getloadavg()}")
    reference = next(iter(figures.values()))
    for label, values in figures.items():
        ratios = [v / ref for v, ref in zip(values, reference, strict=True)]
        summary = {
            "tree": label,
            "setup_cpu_ms_per_stream_median": round(statistics.median(values), 3),
            "min": round(min(values), 3),
            "ratio_to_first_median": round(statistics.median(ratios), 3),
            "lower_in_rounds": sum(r < 1 for r in ratios),
            "rounds": len(values),
        }
        if args.json:
            summary["all"] = [round(v, 3) for v in values]
            if label in store:
                summary["store_all"] = [round(v, 3) for v in store[label]]
            print(json.dumps(summary))
        else:
            print(summary)


if __name__ == "__main__":
    main()
