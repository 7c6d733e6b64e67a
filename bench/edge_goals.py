"""Issue 11's goals in one run: every command docs/benchmarks.md names for them, one after another on
this machine, their raw output kept in one folder, then each goal's figure beside its floor and a
verdict (bench/edge_goals_verdict.py), as a table (DIR/goals.md) and a plot (DIR/goals.png).

python -m bench.edge_goals [--out DIR] [--only streams,setup,...] [--quick]
python -m bench.edge_goals --from DIR      (judge a run already made; measures nothing)

Why one runner: the goals are ratios and floors of one machine at one time (an instance of this
kind runs the same code 2x faster or slower from one session to the next), and "done" means they
hold in one run of the commands. Each command runs alone (run nothing else meanwhile): its JSON
lines go to DIR/NAME.jsonl, everything else it prints to DIR/NAME.log, and DIR/run.json says
which commands ran, when, for how long, and the load average before each. The whole run takes
about 25 minutes on 2 cores; `--quick` runs every command small (a smoke run: its figures mean
nothing), `--only` some of them (into a kept run's folder: those commands' output is added or
replaced, the rest stays, and run.json says when each ran).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from bench.__main__ import machine
from bench.edge_goals_verdict import figures_of, plot, read_run, table
from bench.names import names_of

REPO = Path(__file__).resolve().parents[1]

# Where a command writes its JSON itself rather than on stdout.
OUT_FILE = "{jsonl}"


@dataclass(frozen=True)
class Step:
    """One command: `python -m MODULE ARGS` (`quick`: the same, small); arguments split on spaces."""

    module: str
    args: str
    quick: str


STEPS: dict[str, Step] = {
    # CPU per token at real pacing (one step clock and a clock per stream), set-up per stream, RSS,
    # the Triton path at the same pace, two workers, and the bare floors beside them.
    "streams": Step(
        "bench.streams",
        "--workers 1,2 --upstream in-process,triton --bare --json",
        "--paced 33:4 --workers 1 --upstream in-process,triton --bare --window 1 --setup-count 10 --ramp 50 "
        "--json",
    ),
    # The Triton path and the in-process one (and both floors) holding their streams side by side in
    # one window: their ratio under the same machine load, steadier than from windows minutes apart.
    "streams-paired": Step(
        "bench.streams",
        "--paced 33:200,500:1000 --replicas 1 --workers 1 --upstream in-process,triton --bare --paired 1 "
        "--json",
        "--paced 33:4 --replicas 1 --workers 1 --upstream in-process,triton --bare --paired 1 --window 1 "
        "--setup-count 10 --ramp 50 --json",
    ),
    # CPU per token and set-up per stream with the limiter on Redis, production's backend: every
    # stream's admit and settle, and its lease's charges, are round trips (the rows above use the
    # in-process twin, whose calls are local).
    "streams-redis": Step(
        "bench.streams",
        "--paced 33:200 --replicas 1,0 --workers 1 --limiter redis --bare --json",
        "--paced 33:4 --replicas 1 --workers 1 --limiter redis --bare --window 1 --setup-count 10 --ramp 50 "
        "--json",
    ),
    # 10,000 streams at 2 tokens/s in one process.
    "streams-10k": Step(
        "bench.streams",
        "--paced 500:10000 --replicas 0 --workers 1 --gc quiet --ramp 300 --window 10 --json",
        "--paced 500:20 --replicas 0 --workers 1 --ramp 100 --window 1 --setup-count 10 --json",
    ),
    # Set-up CPU per stream in alternating bursts (steadier than bench.streams' single burst), on
    # the in-process twin and on Redis (the admit's and settle's round trips), beside the bare server.
    "setup": Step(
        "bench.streams_setup",
        "--trees now=. --rounds 16 --count 600 --bare --prompts same,new --limiter memory,redis --json",
        "--trees now=. --rounds 2 --count 20 --bare --prompts same,new --limiter memory,redis --json",
    ),
    # As fast as read: the Triton path against the zero-cost upstream (bench/zero_cost_replica.py).
    "relay": Step(
        "bench.relay",
        "--variants edge,triton-zero --concurrency 1,64,256 --duration 5 --json",
        "--variants edge,triton-zero --concurrency 1,4 --duration 1 --chunks 16 --json",
    ),
    # The edge's share of time to first token, 50 streams open, admits among their tokens; on a
    # connection per stream and on connections kept alive.
    "ttft": Step(
        "bench.ttft_overhead",
        "--limiters redis,redis-cluster-tls,bare --arrivals spread --connections new,kept --json",
        "--limiters redis,bare --arrivals spread --connections new,kept --concurrency 4 --tokens 3 "
        "--duration 1 --json",
    ),
    # The same with admits spread over the upstream's step.
    "ttft-think": Step(
        "bench.ttft_overhead",
        "--limiters redis,redis-cluster-tls,bare --arrivals spread --think-ms 33 --connections new,kept "
        "--json",
        "--limiters redis,bare --arrivals spread --think-ms 33 --concurrency 4 --tokens 3 --duration 1 "
        "--json",
    ),
    # Limiter decisions/s against redis-py's trivial EVALSHA, 50 callers, alternating rounds.
    "limiter": Step(
        "bench.limiter",
        f"--out {{dir}}/limiter.md --json {OUT_FILE}",
        f"--decisions 300 --rounds 1 --concurrency 4 --out {{dir}}/limiter.md --json {OUT_FILE}",
    ),
    # The real model through local Triton against the in-process engine (last: the longest).
    "triton": Step(
        "bench.triton_vs_local",
        f"--streams 64,100 --max-tokens 32 --prompt-len 32 --repeat 3 --paths triton --json {OUT_FILE}",
        "--model floodgate-tiny --streams 2 --max-tokens 4 --prompt-len 8 --repeat 1 --paths triton "
        f"--json {OUT_FILE}",
    ),
}


def command(name: str, out: Path, quick: bool) -> list[str]:
    step = STEPS[name]
    jsonl = out / f"{name}.jsonl"
    args = [a.format(dir=out, jsonl=jsonl) for a in (step.quick if quick else step.args).split()]
    return [sys.executable, "-m", step.module, *args]


def run_step(name: str, out: Path, quick: bool) -> dict[str, object]:
    """Run one command; its JSON lines into NAME.jsonl (unless it writes that itself), the rest into
    NAME.log. Returns what run.json records of it."""
    argv = command(name, out, quick)
    writes_itself = OUT_FILE in STEPS[name].args.split()
    # A kept run's file (`--only` into its folder) must not outlive a command that fails this time
    # before writing its own: the table would judge the earlier run's figures as this one's.
    (out / f"{name}.jsonl").unlink(missing_ok=True)
    started = time.time()
    load = os.getloadavg()[0]
    print(f"[{time.strftime('%H:%M:%S')}] {name}: {' '.join(argv[1:])}", flush=True)
    with (out / f"{name}.log").open("w") as log:
        done = subprocess.run(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=log, text=True, check=False)
        # What a command prints as JSON lines is kept once, in NAME.jsonl when it prints them.
        printed = done.stdout.splitlines()
        log.writelines(f"{line}\n" for line in printed if not line.startswith("{"))
    if not writes_itself:
        lines = [line for line in printed if line.startswith("{")]
        (out / f"{name}.jsonl").write_text("".join(f"{line}\n" for line in dict.fromkeys(lines)))
    if done.returncode != 0:
        print(f"  {name} failed ({done.returncode}): see {out / (name + '.log')}", flush=True)
    return {
        "command": "python " + " ".join(argv[1:]).replace(str(out), "DIR"),
        "started_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(started)),
        "seconds": round(time.time() - started, 1),
        "loadavg_before": round(load, 2),
        "returncode": done.returncode,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.edge_goals", description=__doc__)
    parser.add_argument("--out", type=Path, help="folder for the raw output (default: a new one under /tmp)")
    parser.add_argument(
        "--only",
        default=",".join(STEPS),
        type=names_of(STEPS, empty_ok=True),
        help=f"commands to run, of {','.join(STEPS)}",
    )
    parser.add_argument("--quick", action="store_true", help="every command small: a smoke run")
    parser.add_argument("--from", dest="source", type=Path, help="judge this earlier run; run nothing")
    args = parser.parse_args(argv)
    if args.source is not None:
        if not (args.source / "run.json").is_file():
            parser.error(f"--from {args.source}: not a kept run (no run.json there)")
        out = args.source
    else:
        names = [n for n in args.only.split(",") if n]
        out = args.out or Path(time.strftime("/tmp/edge-goals-%Y%m%d-%H%M%S"))
        out.mkdir(parents=True, exist_ok=True)
        # Into a kept run's folder, `--only` adds or replaces those commands' output, the rest stays.
        kept = out / "run.json"
        steps: dict[str, object] = json.loads(kept.read_text())["steps"] if kept.exists() else {}
        for name in names:
            steps[name] = run_step(name, out, args.quick)
            record = {"machine": machine(), "quick": args.quick, "steps": steps}
            (out / "run.json").write_text(json.dumps(record, indent=1) + "\n")
    raw = read_run(out)
    figures = figures_of(raw)
    text = table(figures, raw)
    (out / "goals.md").write_text(text)
    plot(figures, raw, out / "goals.png")
    print(text)
    print(f"raw output, table and plot: {out}")
    failed = [n for n, s in raw.steps.items() if s.get("returncode") not in (0, None)]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
