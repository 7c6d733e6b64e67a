"""Limiter throughput and latency on a real redis-server, beside Redis's own floor.

    .venv/bin/python -m bench.limiter [--decisions N] [--concurrency C] [--out docs/bench-limiter.md]

Starts its own redis-server on a free loopback port. One decision = `admit` (what a request waits
for before its stream opens) + `settle` (after the stream), each one EVALSHA. Measured over one
connection (one caller) and over a pool (C concurrent callers), plus the in-memory twin. In the
same run `redis-benchmark` calls EVALSHA of a trivial script (`return 1`) on the same server with
1 and C clients: the floor for any limiter that runs a script per call. Prints a markdown table
and writes it, with the machine, to --out.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import io
import json
import os
import platform
import shutil
import statistics
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from redis import Redis as SyncRedis
from redis.asyncio import Redis as RedisAsync
from redis.exceptions import ConnectionError as RedisConnectionError

from bench.free_ports import free_port
from limiter.base import Limiter, TierLimits
from limiter.memory import MemoryLimiter
from limiter.redis_store import RedisLimiter

TIER = TierLimits(
    requests_per_window=10**9,
    request_window_s=3600,
    tokens_per_window=10**12,
    token_window_s=86400,
    max_concurrent=10**6,
    max_tokens=4096,
)
USERS = 10_000


@dataclass
class Row:
    what: str
    clients: int
    per_s: float  # decisions (limiter rows) or calls (redis-benchmark rows) per second
    p50_ms: float  # admit latency (limiter rows), call latency (redis-benchmark rows)
    p99_ms: float
    server_us: float | None  # Redis CPU per EVALSHA (INFO commandstats usec_per_call)
    # CPU per decision (or call): this process plus redis-server, from /proc. Unlike per_s it
    # hardly moves with what else runs on the machine, so its ratio is the steadier yardstick.
    cpu_us: float | None = None
    # redis-server's own share of cpu_us: the whole process (reading, parsing and answering each
    # command, not only the script that server_us times), what sizes a Redis fleet.
    redis_cpu_us: float | None = None


class CpuMeter:
    """CPU seconds of this process and of the redis-servers (their pids; a Cluster has several)
    over a stretch of work."""

    def __init__(self, *redis_pids: int) -> None:
        self._pids = redis_pids
        self._start_redis = self._redis_now()
        self._start = time.process_time() + self._start_redis

    def _redis_now(self) -> float:
        total = 0.0
        for pid in self._pids:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        return total

    def us_per(self, operations: int) -> float:
        return (time.process_time() + self._redis_now() - self._start) * 1e6 / operations

    def redis_us_per(self, operations: int) -> float | None:
        return (self._redis_now() - self._start_redis) * 1e6 / operations if self._pids else None


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _start_redis(workdir: str) -> tuple[subprocess.Popen[bytes], int]:
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server is not installed")
    port = free_port()
    args = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    process = subprocess.Popen([*args, "--dir", workdir], stdout=subprocess.DEVNULL)
    client = SyncRedis(port=port)
    deadline = time.monotonic() + 10
    while True:
        try:
            client.ping()
            return process, port
        except RedisConnectionError:
            if time.monotonic() > deadline:
                process.kill()
                raise
            time.sleep(0.02)  # polling a server that is still starting, bounded by the deadline


def _server_us_per_evalsha(port: int) -> float | None:
    stats = SyncRedis(port=port).info("commandstats").get("cmdstat_evalsha")
    return float(stats["usec_per_call"]) if stats else None


def _reset_stats(port: int) -> None:
    SyncRedis(port=port).config_resetstat()


async def _decisions(
    limiter: Limiter, decisions: int, clients: int, what: str, port: int | None, *redis_pids: int
) -> Row:
    """`decisions` admits (each settled after), `clients` callers at once; CPU counted for this
    process and `redis_pids`, Redis's own time per call read from `port` when given."""
    admit_ms: list[float] = []
    per_client = decisions // clients
    run = uuid.uuid4().hex[:8]  # request ids are unique, as the edge's are (admit is idempotent per id)

    async def client(c: int) -> None:
        for i in range(per_client):
            user = f"user-{(c * per_client + i) % USERS}"
            started = time.perf_counter()
            admission = await limiter.admit(user, f"{run}-{c}-{i}", TIER, 100, 0)
            admit_ms.append((time.perf_counter() - started) * 1000)
            assert admission.decision.allowed and admission.lease is not None
            await admission.lease.settle()

    if port is not None:
        _reset_stats(port)
    cpu = CpuMeter(*redis_pids)
    started = time.perf_counter()
    await asyncio.gather(*(client(c) for c in range(clients)))
    wall = time.perf_counter() - started
    return Row(
        what,
        clients,
        len(admit_ms) / wall,
        _percentile(admit_ms, 0.5),
        _percentile(admit_ms, 0.99),
        _server_us_per_evalsha(port) if port is not None else None,
        cpu.us_per(len(admit_ms)),
        cpu.redis_us_per(len(admit_ms)),
    )


async def _redis_py_evalsha(url: str, calls: int, clients: int, redis_pid: int | None = None) -> Row:
    """redis-py asyncio calling EVALSHA of `return 1`, `clients` callers over one pool: the same
    client library and event loop the limiter pays for, with a script that does nothing."""
    client = RedisAsync.from_url(url, max_connections=clients)
    sha = await client.script_load("return 1")
    latencies: list[float] = []
    per_client = calls // clients

    async def caller() -> None:
        for _ in range(per_client):
            started = time.perf_counter()
            await client.evalsha(sha, 0)
            latencies.append((time.perf_counter() - started) * 1000)

    await asyncio.gather(*(caller() for _ in range(clients)))  # warm-up: open the connections
    latencies.clear()
    _reset_stats(int(url.rsplit(":", 1)[1].split("/")[0]))
    cpu = CpuMeter(*([] if redis_pid is None else [redis_pid]))
    started = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(clients)))
    wall = time.perf_counter() - started
    cpu_us = cpu.us_per(len(latencies))
    redis_cpu_us = cpu.redis_us_per(len(latencies))
    await client.aclose()
    return Row(
        "redis-py asyncio: EVALSHA of `return 1`",
        clients,
        len(latencies) / wall,
        _percentile(latencies, 0.5),
        _percentile(latencies, 0.99),
        None,
        cpu_us,
        redis_cpu_us,
    )


def _redis_benchmark(port: int, requests: int, clients: int) -> Row:
    sha = SyncRedis(port=port).script_load("return 1")
    _reset_stats(port)
    command = ["redis-benchmark", "-p", str(port), "-n", str(requests), "-c", str(clients), "--csv"]
    out = subprocess.run([*command, "EVALSHA", sha, "0"], check=True, capture_output=True, text=True).stdout
    row = list(csv.DictReader(io.StringIO(out)))[-1]
    return Row(
        "redis-benchmark: EVALSHA of `return 1`",
        clients,
        float(row["rps"]),
        float(row["p50_latency_ms"]),
        float(row["p99_latency_ms"]),
        _server_us_per_evalsha(port),
    )


def _machine() -> str:
    model = platform.processor() or "unknown CPU"
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    redis_version = subprocess.run(["redis-server", "--version"], capture_output=True, text=True).stdout
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return (
        f"`nproc` {len(os.sched_getaffinity(0))}, {model}; Python {platform.python_version()}; "
        f"{redis_version.split(' sha')[0].strip()}; load average before the run: {load}"
    )


def _ratios(rows: list[Row]) -> str:
    limiter = {r.clients: r.per_s for r in rows if r.what.startswith("limiter on Redis")}
    redis_py = {r.clients: r.per_s for r in rows if r.what.startswith("redis-py")}
    return ", ".join(
        f"{limiter[c] / redis_py[c]:.0%} with {c} caller(s)" for c in sorted(limiter) if c in redis_py
    )


def _table(rows: list[Row]) -> str:
    lines = [
        "| what | callers | per second | p50 ms | p99 ms | Redis µs per EVALSHA | CPU µs per op "
        "| of which redis-server |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        server = "" if r.server_us is None else f"{r.server_us:.2f}"
        cpu = "" if r.cpu_us is None else f"{r.cpu_us:.0f}"
        redis_cpu = "" if r.redis_cpu_us is None else f"{r.redis_cpu_us:.0f}"
        figures = f"{r.per_s:,.0f} | {r.p50_ms:.3f} | {r.p99_ms:.3f} | {server} | {cpu} | {redis_cpu}"
        lines.append(f"| {r.what} | {r.clients} | {figures} |")
    return "\n".join(lines)


async def run(decisions: int, concurrency: int, rounds: int) -> tuple[list[Row], list[tuple[float, float]]]:
    """The table's rows, and for each of `rounds` back-to-back pairs at `concurrency` (the two
    alternate, so a change in the machine's load between rows moves both sides alike): limiter
    decisions/s over redis-py's trivial calls/s, and the same ratio in CPU (trivial call's CPU
    over a decision's)."""
    with tempfile.TemporaryDirectory() as workdir:
        process, port = _start_redis(workdir)
        try:
            url = f"redis://127.0.0.1:{port}/0"
            what = "limiter on Redis: admit + settle"
            one = RedisLimiter.from_url(url, timeout_ms=5000, max_connections=1)
            await _decisions(one, 1000, 1, "warm-up", None)
            rows = [await _decisions(one, decisions, 1, what, port, process.pid)]
            await one.aclose()
            rows.append(await _redis_py_evalsha(url, decisions, 1, process.pid))
            pool = RedisLimiter.from_url(url, timeout_ms=5000, max_connections=concurrency)
            ratios = []
            for _ in range(rounds):
                limiter_row = await _decisions(pool, decisions, concurrency, what, port, process.pid)
                redis_py_row = await _redis_py_evalsha(url, decisions, concurrency, process.pid)
                assert limiter_row.cpu_us and redis_py_row.cpu_us
                ratios.append(
                    (limiter_row.per_s / redis_py_row.per_s, redis_py_row.cpu_us / limiter_row.cpu_us)
                )
            await pool.aclose()
            rows += [limiter_row, redis_py_row]  # the last round's pair
            rows.append(_redis_benchmark(port, decisions, 1))
            rows.append(_redis_benchmark(port, decisions * 2, concurrency))
            rows.append(
                await _decisions(MemoryLimiter(), decisions, 1, "in-memory twin: admit + settle", None)
            )
            return rows, ratios
        finally:
            process.kill()
            process.wait()


def main() -> None:
    machine = _machine()  # before the run, so the load average is the machine's, not ours
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--decisions", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", default="docs/bench-limiter.md")
    parser.add_argument("--json", type=Path, help="also write the alternating rounds' ratios here, as JSON")
    args = parser.parse_args()
    rows, ratios = asyncio.run(run(args.decisions, args.concurrency, args.rounds))
    table = _table(rows)
    rounds = ", ".join(f"{r:.0%}" for r, _ in ratios)
    median = statistics.median(r for r, _ in ratios)
    cpu_rounds = ", ".join(f"{c:.0%}" for _, c in ratios)
    cpu_median = statistics.median(c for _, c in ratios)
    print(table)
    print(f"limiter / redis-py trivial EVALSHA: {_ratios(rows)}")
    print(f"with {args.concurrency} callers, {args.rounds} alternating rounds: {rounds}; median {median:.0%}")
    print(f"the same in CPU per operation (client + redis-server): {cpu_rounds}; median {cpu_median:.0%}")
    if args.json:
        # The last round's limiter row at this concurrency: per decision (admit + settle).
        last = next(r for r in rows if r.what.startswith("limiter") and r.clients == args.concurrency)
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps(
                {
                    "concurrency": args.concurrency,
                    "decisions_per_s_ratios": [round(r, 3) for r, _ in ratios],
                    "median": round(median, 3),
                    "cpu_ratios": [round(c, 3) for _, c in ratios],
                    "cpu_median": round(cpu_median, 3),
                    "redis_cpu_us_per_decision": last.redis_cpu_us,
                    "redis_script_us_per_evalsha": last.server_us,
                }
            )
            + "\n"
        )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(
        "# Limiter benchmark\n\n"
        f"`.venv/bin/python -m bench.limiter --decisions {args.decisions} --concurrency {args.concurrency} "
        f"--rounds {args.rounds}`"
        f", {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.\n\n"
        f"Machine: {machine}. The Python client and redis-server share the machine.\n\n"
        "Limiter rows: one decision = `admit` + `settle`, one EVALSHA each; *per second* counts "
        "decisions, p50/p99 are the `admit` call as a request waits for it (the latency the limiter "
        "adds before a stream opens). On the limiter's own connection the commands concurrent "
        "callers send in one pass of the event loop share a write. redis-py rows: redis-py asyncio "
        "calling EVALSHA of `return 1` with the same number of callers, the same client library and "
        "event loop: the issue's yardstick (decisions/s >= 70 % of it at the same concurrency). "
        "redis-benchmark rows: the same trivial script from C, the server's floor. *Redis µs per "
        "EVALSHA*: the script's own time (INFO commandstats); *CPU µs per op*: this process and "
        "redis-server, from /proc; *of which redis-server*: the server process's share, its reading, "
        "parsing and answering of every command included (what sizes a Redis fleet).\n\n"
        f"{table}\n\n"
        f"Limiter decisions/s against redis-py's trivial EVALSHA calls/s, same run: "
        f"{_ratios(rows)} (the rows above). With {args.concurrency} callers, in {args.rounds} "
        f"alternating rounds (limiter, then redis-py, back to back): {rounds}; **median "
        f"{median:.0%}** (goal >= 70 %). The same pairs in CPU (this process and redis-server, "
        f"per operation; steadier on a shared machine): {cpu_rounds}; median {cpu_median:.0%}.\n"
    )


if __name__ == "__main__":
    main()
