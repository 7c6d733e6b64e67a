"""`make bench`: a short default load through a real edge on loopback, printed as a table.

python -m bench [--concurrency 1,16,64] [--duration 10] [--max-tokens 64]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform

from bench.edge_server import edge_process
from bench.loadgen import markdown_table, run_load, summarize


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


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench")
    parser.add_argument("--concurrency", default="1,16,64")
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--paths", default="local,triton")
    args = parser.parse_args()
    rows = []
    for path in args.paths.split(","):
        with edge_process(triton="local" if path == "triton" else None) as edge:
            for n in (int(x) for x in args.concurrency.split(",")):
                cpu_before = edge.cpu_seconds()
                load = asyncio.run(
                    run_load(
                        edge.base_url,
                        edge.key,
                        concurrency=n,
                        duration_s=args.duration,
                        max_tokens=args.max_tokens,
                    )
                )
                rows.append(summarize(f"{path}, {n} streams", load, edge.cpu_seconds() - cpu_before))
    print(f"machine: {machine()}")
    print(markdown_table(rows))


if __name__ == "__main__":
    main()
