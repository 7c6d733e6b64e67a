"""The engine's decode with the kernels numpy's OpenBLAS picks by itself against the CPU's own, in
one run: each variant in a fresh process (OPENBLAS_CORETYPE is read when OpenBLAS loads),
interleaved A B B A so a change in the box's load falls on both alike. Decode tokens/s of 1, 4 and
16 streams (the engine alone), per wall second and per second of the engine thread's CPU time.

Why: numpy's wheels bundle OpenBLAS, which picks its kernels by CPU model; a model it does not know
gets the generic "Prescott" kernels (SSE3). This machine's Xeon (family 6, model 207, AVX-512) is
one. The CPU's own kernels ("SkylakeX" for AVX-512, "Haswell" for AVX2 with FMA) are asked for only
where OpenBLAS fell back to Prescott. Results: docs/bench-engine-blas.md.

    .venv/bin/python -m bench.engine_blas [--model DIR] [--tokens 48] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

STREAMS = (1, 4, 16)


_AVX512 = frozenset({"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"})
_AVX2 = frozenset({"avx2", "fma"})


def coretype_for(cpu_flags: frozenset[str], detected: str | None) -> str | None:
    """The kernels to ask OpenBLAS for, given what it detected; None: keep its choice."""
    if detected is None or detected.lower() != "prescott":
        return None
    if _AVX512 <= cpu_flags:
        return "SkylakeX"
    if _AVX2 <= cpu_flags:
        return "Haswell"
    return None


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    try:
        text = cpuinfo.read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.partition(":")[2].split())
    return frozenset()


def detected_architecture() -> str | None:
    """The kernels this process's OpenBLAS (numpy's) chose, as threadpoolctl reports them."""
    import numpy  # noqa: F401  # BLAS must be loaded for threadpoolctl to find it
    from threadpoolctl import threadpool_info

    for pool in threadpool_info():
        if pool.get("internal_api") == "openblas":
            architecture = pool.get("architecture")
            return str(architecture) if architecture else None
    return None


def child(model: Path | None, tokens: int) -> None:
    from bench.engine import SERVE_CONFIG, default_model
    from bench.engine_knee import decode
    from gpu_container.engine.blas_threads import limit_blas_threads
    from gpu_container.engine.loader import load_model

    loaded = load_model(model or default_model())
    limit_blas_threads(SERVE_CONFIG.blas_threads)
    rates = {n: decode(loaded, SERVE_CONFIG, n, tokens) for n in STREAMS}
    print(json.dumps({"kernels": detected_architecture(), "knee_rows": loaded.knee_rows, "rates": rates}))


def run_variant(chosen: bool, model: Path | None, tokens: int) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_CORETYPE"}
    if chosen:
        coretype = coretype_for(cpu_flags(), detected_architecture())
        if coretype is None:
            raise SystemExit("OpenBLAS recognised this CPU: nothing to compare")
        env["OPENBLAS_CORETYPE"] = coretype
    command = [sys.executable, "-m", "bench.engine_blas", "--child", "--tokens", str(tokens)]
    if model is not None:
        command += ["--model", str(model)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.engine_blas")
    parser.add_argument("--model", type=Path)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=2, help="A B B A rounds")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.model, args.tokens)
        return
    print(f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, load average {os.getloadavg()[0]:.1f}", flush=True)
    results: dict[bool, list[dict[str, Any]]] = {False: [], True: []}
    for _ in range(args.rounds):
        for chosen in (False, True, True, False):
            result = run_variant(chosen, args.model, args.tokens)
            results[chosen].append(result)
            print(("chosen " if chosen else "own    ") + json.dumps(result), flush=True)
    print(f"load average after {os.getloadavg()[0]:.1f}")
    print("| streams | OpenBLAS's own kernels, tokens/s (per CPU s) | chosen kernels | ratio (per CPU s) |")
    print("|---|---|---|---|")
    for n in STREAMS:
        own: list[list[float]] = [r["rates"][str(n)] for r in results[False]]
        picked: list[list[float]] = [r["rates"][str(n)] for r in results[True]]
        wall = sum(c[0] for c in picked) / sum(o[0] for o in own)
        cpu = sum(c[1] for c in picked) / sum(o[1] for o in own)
        print(
            f"| {n} | {', '.join(f'{o[0]:.1f} ({o[1]:.1f})' for o in own)} "
            f"| {', '.join(f'{c[0]:.1f} ({c[1]:.1f})' for c in picked)} | {wall:.2f}x ({cpu:.2f}x) |"
        )


if __name__ == "__main__":
    main()
