"""What the edge spends per token at a real model's pace, per stream set up, and per open stream.

python -m bench.streams [--paced 33:200,500:1000] [--workers 1,2] [--upstream in-process,triton] [--json]

For each pacing (ms between tokens : streams held) and worker count, a real edge app
(`create_app`: auth, limiter, admission, detokenizer, metrics, the request log line) serves in
front of `PacedUpstream` (bench/paced_upstream.py: zero compute, one token per step to every
running sequence), with the uvicorn settings of `floodgate serve`; `--workers 2` runs two such
processes on one port with SO_REUSEPORT and sums their CPU. `--upstream triton` puts the Triton
path beside it: the edge's own Triton client reading bench/zero_cost_replica.py (Triton's HTTP
`generate_stream`, no model, the same pace and step clocks) in its own process. Reported, per run:

- set-up CPU per stream: server CPU over a burst of one-token streams (parse, auth, template,
  limiter, admission, first event, close, log line) divided by the streams;
- CPU µs per token: server CPU (each process's CPU clock, in nanoseconds) over a window in which all
  N streams are open and streaming, divided by the tokens the clients received in it (counted
  from the text, so several tokens coalesced in one event count as several); also without the
  servers' idle CPU (3 s with no stream open, before the ramp: timers and polls);
- RSS per stream: the servers' resident memory with N streams open minus before, divided by N;
- inter-token p99 (between content events of one stream, in the window) and errors (non-200,
  error events, client exceptions).

One server process per run: `python -m bench.streams --serve --config FILE --port P --interval-ms X`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import itertools
import json
import math
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import httpx

from bench.__main__ import machine
from bench.edge_server import BENCH_TIER
from bench.free_ports import free_port
from bench.loadgen import markdown_table, percentile
from bench.names import names_of
from bench.paced_upstream import TOKEN_TEXT, PacedUpstream
from bench.redis_process import RedisProcess
from bench.stream_clients import ERROR_EVENT, StreamClients
from bench.trees import parse_trees, tree_python
from bench.zero_cost_replica import running_replica


def _serve(
    config: Path,
    port: int,
    interval_ms: float,
    replicas: int,
    gc_mode: str,
    ready: Path,
    replica_port: int | None,
) -> None:
    import uvicorn

    from edge.app import create_app
    from edge.config import Settings, load_settings
    from edge.logging_setup import configure_logging
    from edge.server import uvicorn_config
    from edge.upstreams.local_pool import PrivateUpstreams

    configure_logging()
    app: Any
    if replica_port is not None:
        # The Triton path: the edge's own Triton client, in front of bench/zero_cost_replica.py.
        spec = f"127.0.0.1:{replica_port}:{replica_port}"
        settings = load_settings(str(config), {"upstream": {"triton": spec}})
        app = create_app(settings)
    else:
        settings = load_settings(str(config))
        upstream = PacedUpstream(interval_ms / 1000, replicas)

        @asynccontextmanager
        async def paced(settings: Settings, model_dir: Path) -> AsyncIterator[list[PacedUpstream]]:
            # Each server's own, as `serve --workers` starts local engines: with the limiter on
            # Redis the servers are fleet members, and a shared replica would be divided between
            # them (a second one waiting two beats for a share, answering 503 no_replica meanwhile).
            yield PrivateUpstreams([upstream])  # type: ignore[misc]

        app = create_app(settings, paced)  # type: ignore[arg-type]

    pauses = _GcPauses()
    gc.callbacks.append(pauses.callback)
    probes: dict[str, Callable[[], Any]] = {"/bench/gc": pauses.totals}
    if os.environ.get("FLOODGATE_BENCH_PHASES") == "1":
        # Where TTFT goes in this server (bench/ttft_phases.py), served at GET /bench/phases, and
        # each request's moments at GET /bench/requests.
        from bench import ttft_phases

        ttft_phases.install()
        probes["/bench/phases"] = ttft_phases.take
        probes["/bench/requests"] = ttft_phases.take_requests

    async def tell_ready(scope: dict[str, Any], receive: Any, send: Any) -> None:
        bench_path = scope["type"] == "http" and scope["path"]
        if bench_path in ("/bench/gc", "/bench/phases", "/bench/requests"):
            probe = probes.get(bench_path)
            found = probe() if probe else None
            status = 404 if found is None else 200
            await send({"type": "http.response.start", "status": status, "headers": []})
            await send({"type": "http.response.body", "body": json.dumps(found).encode()})
            return
        if scope["type"] != "lifespan":
            await app(scope, receive, send)
            return

        async def send_and_mark(message: dict[str, Any]) -> None:
            await send(message)
            if message["type"] == "lifespan.startup.complete":
                ready.touch()  # noqa: ASYNC240 (once, at start-up)

        await app(scope, receive, send_and_mark)

    if gc_mode == "quiet":
        from edge.gc_tuning import quiet_gc

        quiet_gc()  # as `floodgate serve` does
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(("127.0.0.1", port))
    server = uvicorn.Server(uvicorn_config(tell_ready, settings.server, log_config=None))  # type: ignore[arg-type]
    cprofile = os.environ.get("STREAMS_CPROFILE")
    if not cprofile:
        server.run(sockets=[sock])
        return
    # STREAMS_CPROFILE=/tmp/cprof: cProfile's call counts of each server in /tmp/cprof-<pid>.prof
    # (pstats; a coroutine counts a call at every resumption). Written when the server stops,
    # also when uvicorn re-raises the SIGINT that stopped it.
    import cProfile

    profile = cProfile.Profile()
    try:
        profile.runcall(server.run, sockets=[sock])
    finally:
        profile.dump_stats(f"{cprofile}-{os.getpid()}.prof")


class _GcPauses:
    """Time the server spent in garbage collection (gc.callbacks), served at GET /bench/gc."""

    def __init__(self) -> None:
        self.count = 0
        self.total_s = 0.0
        self.max_s = 0.0
        self._started = 0.0

    def callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        took = time.perf_counter() - self._started
        self.count += 1
        self.total_s += took
        self.max_s = max(self.max_s, took)

    def totals(self) -> dict[str, float]:
        """Counts so far, and the longest pause since the last call."""
        longest, self.max_s = self.max_s, 0.0
        return {"count": self.count, "total_s": self.total_s, "max_s": longest}


@dataclass
class Servers:
    base_url: str
    key: str
    pids: list[int]
    # The limiter's redis-server (`--limiter redis`): its CPU is the store's, reported on its own.
    store_pids: list[int] = field(default_factory=list)

    def cpu_seconds(self) -> float:
        return self.cpu_ns() / 1e9

    def user_system_seconds(self) -> tuple[float, float]:
        """User and system (kernel: socket writes, epoll) CPU of the servers so far."""
        user = system = 0
        for pid in self.pids:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            user += int(fields[11])
            system += int(fields[12])
        tick = os.sysconf("SC_CLK_TCK")
        return user / tick, system / tick

    def cpu_ns(self, store: bool = False) -> int:
        """The servers' time on the CPU so far, in nanoseconds (/proc/PID/stat counts 10 ms ticks, a
        few dozen in a window at 500 ms a token): each process's CPU clock, which keeps the time of
        every thread the process ran, ended ones too. Summing /proc/PID/task/*/schedstat instead
        lost a thread that ended between two readings, its whole time: anyio's worker threads (the
        usage writes, the key store's reads) end 10 s after their last call, and one that did took
        its CPU out of a set-up burst's figure (below zero, where it had run long) or never counted
        in a window it came and went in. `store`: the limiter's Redis instead of the servers."""
        return sum(
            time.clock_gettime_ns(_process_clock(pid)) for pid in (self.store_pids if store else self.pids)
        )

    def rss_bytes(self) -> int:
        total = 0
        for pid in self.pids:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        return total


def _process_clock(pid: int) -> int:
    """The clock id of `pid`'s CPU time, all its threads' (glibc's clock_getcpuclockid, which Python
    lacks: Linux's MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED), in nanoseconds)."""
    return ((~pid) << 3) | 2


def _tier(redis_url: str | None, redis_cluster: bool = False) -> str:
    if redis_url is None:
        return BENCH_TIER
    # Into BENCH_TIER's own [limiter] table: TOML allows a table once.
    assert "[limiter]\n" in BENCH_TIER
    cluster = "true" if redis_cluster else "false"
    limiter = f'[limiter]\nbackend = "redis"\nredis_url = "{redis_url}"\nredis_cluster = {cluster}\n'
    return BENCH_TIER.replace("[limiter]\n", limiter, 1)


@contextmanager
def servers(
    interval_ms: float,
    workers: int,
    replicas: int,
    gc_mode: str = "quiet",
    tree: Path | None = None,
    upstream: str = "in-process",
    redis_url: str | None = None,
    redis_cluster: bool = False,
) -> Iterator[Servers]:
    """`tree`: serve from another checkout of the project (its edge/, this bench's server code),
    so a change and the code before it are compared in one run. `upstream` "triton": the servers
    read a zero-cost replica over Triton's HTTP (bench/zero_cost_replica.py, its own process, not
    counted) paced alike, instead of the in-process PacedUpstream. `redis_url`: the limiter on that
    Redis (the production backend; a Cluster with `redis_cluster`) instead of the in-process twin."""
    from edge.config import load_settings
    from edge.keys.provision import create_keys

    with tempfile.TemporaryDirectory(prefix="floodgate-streams-") as tmp:
        port = free_port()
        config = Path(tmp) / "bench.toml"
        config.write_text(
            f'[server]\nport = {port}\n[keys]\nsqlite_path = "{tmp}/keys.db"\n'
            '[model]\nsource = "demo"\nname = "floodgate-tiny"\n'
            f'demo_dir = "{Path(".floodgate/demo-model").resolve()}"\n' + _tier(redis_url, redis_cluster)
        )
        key = create_keys(load_settings(config), {"bench": ("bench", "bench")})["bench"]
        procs: list[subprocess.Popen[bytes]] = []
        logs = []
        replica = contextlib.ExitStack()
        replica_port = None
        try:
            if upstream == "triton":
                replica_port = free_port()
                replica.enter_context(running_replica(replica_port, interval_ms, replicas, tree))
            for i in range(workers):
                ready = Path(tmp) / f"ready-{i}"
                log = open(Path(tmp) / f"server-{i}.log", "w")
                logs.append(log)
                cmd = [tree_python(tree), "-m", "bench.streams", "--serve", "--config", str(config)]
                cmd += ["--port", str(port), "--interval-ms", str(interval_ms), "--ready", str(ready)]
                cmd += ["--replicas", str(replicas), "--gc", gc_mode]
                if replica_port is not None:
                    cmd += ["--replica-port", str(replica_port)]
                profile = os.environ.get("STREAMS_PROFILE")
                if profile:
                    # STREAMS_PROFILE=/tmp/prof: py-spy's collapsed stacks of worker i in /tmp/prof-<i>.txt
                    # (the CPU figures of such a run are not the server's: it is py-spy's child).
                    # STREAMS_PROFILE_FLAGS: py-spy's other flags; --native loses the Python frames
                    # under uvloop's C ones on some instances (perf record -g -p PID sees both).
                    py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
                    flags = os.environ.get("STREAMS_PROFILE_FLAGS", "--nonblocking").split()
                    out = f"{profile}-{i}.txt"
                    rate = os.environ.get("STREAMS_PROFILE_RATE", "250")  # samples a second
                    cmd = [py_spy, "record", "-r", rate, *flags, "-o", out, "-f", "raw", "--", *cmd]
                env = {**os.environ, "PYTHONPATH": str(tree)} if tree else None
                procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log, cwd=tree, env=env))
            deadline = time.monotonic() + 120
            while not all((Path(tmp) / f"ready-{i}").exists() for i in range(workers)):
                for proc, i in zip(procs, range(workers), strict=True):
                    if proc.poll() is not None:
                        raise RuntimeError(
                            f"server exited: {(Path(tmp) / f'server-{i}.log').read_text()[-2000:]}"
                        )
                if time.monotonic() > deadline:
                    raise RuntimeError("servers did not become ready")
                time.sleep(0.1)
            base_url = f"http://127.0.0.1:{port}"
            while httpx.get(f"{base_url}/readyz", timeout=5).status_code != 200:
                time.sleep(0.1)
            yield Servers(base_url, key, [p.pid for p in procs])
        finally:
            for proc in procs:
                proc.send_signal(signal.SIGINT)
            for proc in procs:
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
            for log in logs:
                log.close()
            replica.close()


@contextmanager
def bare_server(
    interval_ms: float | None = None, replicas: int = 1, upstream: str = "in-process", workers: int = 1
) -> Iterator[Servers]:
    """bench/bare_sse_server.py, the floor under the edge: with `interval_ms`, its streams paced as
    the edge's in-process upstream paces them (same step clocks); `upstream` "triton": read from a
    zero-cost replica of their own (bench/zero_cost_replica.py, its own process, not counted).
    `workers`: that many bare processes on one port (SO_REUSEPORT), as `serve --workers` runs the
    edge, sharing the replica as the edge's workers do."""
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="floodgate-bare-") as tmp, contextlib.ExitStack() as replica:
        readies = [Path(tmp) / f"ready-{i}" for i in range(workers)]
        paced: list[str] = []
        if interval_ms is not None:
            paced = [str(interval_ms), str(replicas)]
            if upstream == "triton":
                replica_port = free_port()
                replica.enter_context(running_replica(replica_port, interval_ms, replicas))
                paced.append(str(replica_port))
        procs = [
            subprocess.Popen(
                [sys.executable, "-m", "bench.bare_sse_server", str(port), str(ready), *paced],
                stdout=subprocess.DEVNULL,
            )
            for ready in readies
        ]
        try:
            deadline = time.monotonic() + 60
            while not all(ready.exists() for ready in readies):
                if any(p.poll() is not None for p in procs) or time.monotonic() > deadline:
                    raise RuntimeError("the bare server did not start")
                time.sleep(0.1)
            yield Servers(f"http://127.0.0.1:{port}", "none", [p.pid for p in procs])
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                proc.wait(timeout=30)


PROMPT = "Tell me about continuous batching."
# Numbers no stream has sent before, for `setup_cost(new_prompts=True)`: across rounds and servers.
_NEW_PROMPT_NUMBERS = itertools.count()


def _body(max_tokens: int, prompt: str = PROMPT) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "floodgate-tiny",
        "messages": [{"role": "user", "content": prompt}],
        "stream": True,
        "max_tokens": max_tokens,
    }
    # STREAMS_STOP="<JSON list>": stop strings on every request (the paced tokens never match
    # them): what matching them costs a token.
    if stop := os.environ.get("STREAMS_STOP"):
        body["stop"] = json.loads(stop)
    return body


async def _one_stream(session: aiohttp.ClientSession, url: str, headers: dict[str, str], prompt: str) -> bool:
    """A one-token stream read to its end; whether it came back whole (200, no error event). Only
    the server's CPU is measured here, so the client does no more than that."""
    try:
        async with session.post(url, json=_body(1, prompt), headers=headers) as resp:
            body = await resp.read()
    except (TimeoutError, aiohttp.ClientError):
        return False
    return resp.status == 200 and ERROR_EVENT not in body


async def setup_cost(
    srv: Servers, concurrency: int, count: int, new_prompts: bool = False
) -> tuple[float, int]:
    """Server CPU per one-token stream, and errors. Every stream sends the same prompt, as an app's
    users send its system prompt and a chat its history (the edge keeps their pieces' token ids,
    edge/text/piece_cache.py), or with `new_prompts` one no stream sent before (none kept)."""
    url = f"{srv.base_url}/v1/chat/completions"
    headers = {"Authorization": f"Bearer {srv.key}"}
    errors = 0
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        todo = iter(range(count))

        async def worker() -> None:
            nonlocal errors
            for _ in todo:
                prompt = f"{PROMPT} Take {next(_NEW_PROMPT_NUMBERS)}." if new_prompts else PROMPT
                errors += not await _one_stream(session, url, headers, prompt)

        await asyncio.gather(*(worker() for _ in range(min(concurrency, 8))))  # warm-up
        todo = iter(range(count))
        before = srv.cpu_seconds()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        cpu = srv.cpu_seconds() - before
    return cpu / count, errors


def hold(
    group: list[Servers],
    streams: int,
    interval_s: float,
    ramp_per_s: float,
    settle_s: float,
    window_s: float,
    client_processes: int,
) -> list[dict[str, Any]]:
    """Hold `streams` paced streams on each server of `group` at once, measured in one window: with
    several (`--paired`), every version sees the same machine load."""
    lifetime = streams / ramp_per_s + settle_s + window_s + 10 * interval_s + 5
    # Three times what the plan needs (a loaded machine ramps slower), within the demo model's
    # context (2,048 with the prompt): the streams are cancelled once the window closes.
    max_tokens = min(2000, 3 * int(lifetime / interval_s) + 1)
    rss_before = [srv.rss_bytes() for srv in group]
    # What the servers spend with no stream open (timers, polls): part of every per-token figure.
    # As long as the window, up to 3 s: a smoke run's 1 s window needs no 3 s of idle figure.
    idle_before, idle_start = [srv.cpu_ns() for srv in group], time.perf_counter()
    time.sleep(min(3.0, window_s))
    idle_s = time.perf_counter() - idle_start
    idle_share = [(srv.cpu_ns() - b) / 1e9 / idle_s for srv, b in zip(group, idle_before, strict=True)]
    clients = []
    try:
        for srv in group:
            host, port = srv.base_url.removeprefix("http://").split(":")
            clients.append(
                StreamClients(
                    host,
                    int(port),
                    srv.key,
                    _body(max_tokens),
                    streams,
                    ramp_per_s,
                    len(TOKEN_TEXT),
                    client_processes,
                )
            )
        for c in clients:
            c.wait_ramped()
        time.sleep(settle_s)
        gc_before = [_gc_totals(srv.base_url) for srv in group]
        before = [srv.user_system_seconds() for srv in group]
        before_ns = [srv.cpu_ns() for srv in group]
        store_before_ns = [srv.cpu_ns(store=True) for srv in group]
        for c in clients:
            c.open_window()
        opened = time.perf_counter()
        time.sleep(window_s)
        after_ns = [srv.cpu_ns() for srv in group]
        store_after_ns = [srv.cpu_ns(store=True) for srv in group]
        after = [srv.user_system_seconds() for srv in group]
        for c in clients:
            c.close_window()
        elapsed = time.perf_counter() - opened
        rss = [srv.rss_bytes() for srv in group]
        gc_after = [_gc_totals(srv.base_url) for srv in group]
        seen = [c.results() for c in clients]
    finally:
        for c in clients:
            c.kill()
    rows = []
    for i in range(len(group)):
        cpu = (after_ns[i] - before_ns[i]) / 1e9
        # The user / system split has only /proc's ticks: a share of the ticks, not of `cpu`.
        ticks = sum(after[i]) - sum(before[i])
        system = (after[i][1] - before[i][1]) / max(ticks, 1e-9) * cpu
        tokens = max(seen[i].tokens, 1)
        rows.append(
            {
                "streams_streaming": seen[i].streaming,
                "tokens_per_s": seen[i].tokens / elapsed,
                "tokens_due_per_s": streams / interval_s,
                "cpu_us_per_token": cpu / tokens * 1e6,
                "cpu_share": cpu / elapsed,
                "client_cpu_share": seen[i].cpu_s / elapsed,
                "system_share_of_cpu": system / max(cpu, 1e-9),
                "idle_cpu_share": idle_share[i],
                "cpu_us_per_token_above_idle": max(0.0, cpu - idle_share[i] * elapsed) / tokens * 1e6,
                "rss_kib_per_stream": (rss[i] - rss_before[i]) / streams / 1024,
                "itl_p50_ms": percentile(seen[i].gaps, 50) * 1e3,
                "itl_p99_ms": percentile(seen[i].gaps, 99) * 1e3,
                "errors": seen[i].errors,
                "error_kinds": seen[i].error_kinds,
                # Of one worker (whichever answered): exact with --workers 1.
                "gc_pause_share": (gc_after[i]["total_s"] - gc_before[i]["total_s"]) / elapsed,
                "gc_max_pause_ms": gc_after[i]["max_s"] * 1e3,
            }
        )
        if group[i].store_pids:
            store_ns = store_after_ns[i] - store_before_ns[i]
            rows[-1]["store_cpu_us_per_token"] = store_ns / 1e3 / tokens
    return rows


def _gc_totals(base_url: str) -> dict[str, float]:
    """The server's collector totals; NaN when it does not answer in time (a saturated loop) or
    does not keep them (the bare floor)."""
    try:
        totals: dict[str, float] = httpx.get(f"{base_url}/bench/gc", timeout=30).json()
    except (httpx.TimeoutException, json.JSONDecodeError):
        return {"count": math.nan, "total_s": math.nan, "max_s": math.nan}
    return totals


def measure(
    paced: list[tuple[float, int]],
    workers: list[int],
    replicas: list[int],
    gc_modes: list[str],
    trees: list[tuple[str, Path | None]],
    window_s: float,
    ramp_per_s: float,
    setup_count: int,
    client_processes: int = 2,
    paired: int = 0,
    upstreams: tuple[str, ...] = ("in-process",),
    bare: bool = False,
    limiter: str = "memory",
) -> list[dict[str, Any]]:
    """`paired` > 0: the trees' servers run side by side, their set-up cost measured in `paired`
    alternating bursts each (the median reported) and their streams held in one window; with
    several `upstreams`, every upstream's servers too (the Triton path and the in-process one under
    the same load, their ratio from one window). `bare`: a row "bare" beside each group's,
    bench/bare_sse_server.py paced alike (the floor), in the same window when paired. `limiter`
    "redis": each edge server's limiter on a redis-server of its own (production's backend: its
    lease charges are round trips), whose CPU per token is reported beside the server's."""
    rows = []
    # Paired, the upstreams share a group; else each is a run of its own.
    upstream_runs = [upstreams] if paired else [(u,) for u in upstreams]
    for n_workers, (interval_ms, streams), steps, gc_mode, run_upstreams in itertools.product(
        workers, paced, replicas, gc_modes, upstream_runs
    ):
        usable = [
            (label, tree)
            for label, tree in trees
            # A checkout from before edge/gc_tuning.py: CPython's collector only.
            if gc_mode == "default" or not tree or (tree / "edge" / "gc_tuning.py").exists()
        ]
        # 0 replicas: one step clock per stream, so every token arrives on its own.
        n_replicas = steps or streams
        config = {
            "workers": n_workers,
            "interval_ms": interval_ms,
            "streams": streams,
            "replicas": n_replicas,
            "gc": gc_mode,
            "limiter": limiter,
        }
        # A group's members: (label, tree, upstream, is the bare floor).
        groups: list[list[tuple[str, Path | None, str, bool]]] = [
            [(label, tree, upstream, False) for upstream in run_upstreams for label, tree in usable]
        ]
        if not paired:
            groups = [[member] for member in groups[0]]
        if bare:
            floors: list[tuple[str, Path | None, str, bool]] = [
                ("bare", None, upstream, True) for upstream in run_upstreams
            ]
            groups = [[*groups[0], *floors]] if paired else [*groups, *([f] for f in floors)]
        for group in groups:
            with contextlib.ExitStack() as stack:
                srvs = [
                    stack.enter_context(
                        bare_server(interval_ms, n_replicas, upstream, n_workers)
                        if floor
                        else edge_servers(
                            limiter, interval_ms, n_workers, n_replicas, gc_mode, tree, upstream
                        )
                    )
                    for _, tree, upstream, floor in group
                ]
                bursts: list[list[tuple[float, int]]] = [[] for _ in srvs]
                for _ in range(max(paired, 1)):
                    for i, srv in enumerate(srvs):
                        bursts[i].append(asyncio.run(setup_cost(srv, 32, setup_count)))
                held = hold(
                    srvs,
                    streams,
                    interval_ms / 1000,
                    ramp_per_s,
                    min(2.0, window_s),
                    window_s,
                    client_processes,
                )
            for (label, _, upstream, floor), runs, row in zip(group, bursts, held, strict=True):
                rows.append(
                    {
                        **config,
                        "upstream": upstream,
                        **({"upstream": f"bare-{upstream}", "limiter": "none"} if floor else {}),
                        "tree": label,
                        "setup_cpu_ms_per_stream": statistics.median(c for c, _ in runs) * 1e3,
                        "setup_cpu_ms_per_stream_all": [round(c * 1e3, 3) for c, _ in runs],
                        **row,
                        "errors": row["errors"] + sum(e for _, e in runs),
                    }
                )
                print(json.dumps(rows[-1]), file=sys.stderr)
    return rows


@contextmanager
def edge_servers(
    limiter: str,
    interval_ms: float,
    workers: int,
    replicas: int,
    gc_mode: str,
    tree: Path | None,
    upstream: str,
) -> Iterator[Servers]:
    """`servers`, on the in-process limiter or (`limiter` "redis") on a redis-server of their own,
    stopped after them."""
    if limiter not in ("memory", "redis"):
        raise SystemExit(f"--limiter: memory or redis, not {limiter!r}")
    redis = RedisProcess.start() if limiter == "redis" else None
    try:
        with servers(
            interval_ms, workers, replicas, gc_mode, tree, upstream, redis_url=redis.url if redis else None
        ) as srv:
            if redis is not None:
                srv.store_pids = [redis.process.pid]
            yield srv
    finally:
        if redis is not None:
            redis.kill()


def _table(rows: list[dict[str, Any]]) -> str:
    def fmt(v: Any) -> str:
        return f"{v:.1f}" if isinstance(v, float) else str(v)

    return markdown_table([{k: fmt(v) for k, v in row.items()} for row in rows])


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.streams")
    parser.add_argument("--paced", default="33:200,500:1000", help="ms between tokens:streams held, ...")
    parser.add_argument("--workers", default="1,2", help="server processes on one port (SO_REUSEPORT)")
    parser.add_argument(
        "--replicas",
        default="0,1",
        help="step clocks the streams share (0: one per stream, every token its own wake-up)",
    )
    parser.add_argument(
        "--gc",
        default="quiet",
        type=names_of(("default", "quiet")),
        help="default (CPython's) or quiet (edge/gc_tuning.py, as serve does), ...",
    )
    parser.add_argument(
        "--trees",
        default="",
        help="LABEL=DIR,...: serve from these checkouts too, in the same run (default: this one only)",
    )
    parser.add_argument("--window", type=float, default=8.0, help="seconds measured with all streams open")
    parser.add_argument("--ramp", type=float, default=250.0, help="new streams per second while opening")
    parser.add_argument("--setup-count", type=int, default=600, help="one-token streams for the set-up cost")
    parser.add_argument(
        "--clients",
        type=int,
        default=2,
        help="client processes holding the streams (bench/stream_clients.py)",
    )
    parser.add_argument(
        "--paired",
        type=int,
        default=0,
        help="run every tree's and every upstream's servers side by side, N alternating set-up bursts "
        "each, streams held in one window (the same machine load for every version and path)",
    )
    parser.add_argument(
        "--upstream",
        default="in-process",
        type=names_of(("in-process", "triton")),
        help="in-process (PacedUpstream) or triton (a zero-cost replica read over Triton's HTTP), ...",
    )
    parser.add_argument(
        "--bare",
        action="store_true",
        help="add a row 'bare': bench/bare_sse_server.py paced alike, as many processes as the edge's "
        "workers (the floor)",
    )
    parser.add_argument(
        "--limiter",
        default="memory",
        help="memory (the in-process twin) or redis (a redis-server per edge server, production's "
        "backend; its CPU per token reported as store_cpu_us_per_token)",
    )
    parser.add_argument("--json", action="store_true", help="one JSON object per run instead of a table")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--replica-port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--config", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--interval-ms", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--ready", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        replicas = int(args.replicas)
        _serve(args.config, args.port, args.interval_ms, replicas, args.gc, args.ready, args.replica_port)
        return
    gc.collect()
    paced = [(float(a), int(b)) for a, b in (x.split(":") for x in args.paced.split(","))]
    rows = measure(
        paced,
        [int(x) for x in args.workers.split(",")],
        [int(x) for x in args.replicas.split(",")],
        args.gc.split(","),
        parse_trees(args.trees) or [("this", None)],
        args.window,
        args.ramp,
        args.setup_count,
        args.clients,
        args.paired,
        tuple(args.upstream.split(",")),
        args.bare,
        args.limiter,
    )
    if args.json:
        for row in rows:
            print(json.dumps(row))
    else:
        print(f"machine: {machine()}")
        print(_table(rows))


if __name__ == "__main__":
    main()
