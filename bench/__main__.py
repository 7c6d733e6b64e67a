"""`make bench`: a short default load through a real edge on loopback, printed as a table.

python -m bench [--model smollm2-135m-instruct|floodgate-tiny] [--concurrency 1,16]
                [--duration 20] [--max-tokens 64] [--paths local,triton]

The default is the real model (SmolLM2-135M-Instruct, what `make serve` serves); the demo model
(`--model floodgate-tiny`) measures the serving path around a model that costs next to nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform

from bench.edge_server import MODELS, edge_process
from bench.loadgen import markdown_table, run_load, summarize
from bench.names import names_of


def machine() -> str:
    cpu = "unknown CPU"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{os.cpu_count()} cores, {cpu}, Python {platform.python_version()}"


# Where the edge's replicas run: its local CPU engine, or a local tritonserver serving it.
PATHS = ("local", "triton")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench")
    parser.add_argument("--model", default="smollm2-135m-instruct", choices=sorted(MODELS))
    parser.add_argument("--concurrency", default="1,16")
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--paths", default="local,triton", type=names_of(PATHS))
    args = parser.parse_args(argv)
    paths = args.paths.split(",")
    rows = []
    for path in paths:
        with edge_process(triton="local" if path == "triton" else None, model=args.model) as edge:
            for n in (int(x) for x in args.concurrency.split(",")):
                cpu_before, engine_before = edge.cpu_seconds(), edge.engine_cpu_seconds()
                load = asyncio.run(
                    run_load(
                        edge.base_url,
                        edge.key,
                        concurrency=n,
                        duration_s=args.duration,
                        max_tokens=args.max_tokens,
                        model=args.model,
                    )
                )
                # On the triton path the engine runs in tritonserver (also a child): its CPU lands in
                # the engine column either way.
                rows.append(
                    summarize(
                        f"{path}, {n} streams",
                        load,
                        edge.cpu_seconds() - cpu_before,
                        edge.engine_cpu_seconds() - engine_before,
                    )
                )
    print(f"machine: {machine()}, model: {args.model}")
    print(markdown_table(rows))
    # Then the fault drills' long variants: a few minutes (python -m bench.drills, docs/bench-drills.md).
    from bench import drills

    raise SystemExit(drills.main([]))


if __name__ == "__main__":
    main()
