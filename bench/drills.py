"""Long variants of the fault drills (tests/faults/ runs the short ones in `make test`).

python -m bench.drills [--scale 1.0] [--only redis-pause,redis-kill,redis-hang,overload,drain,slow-readers]

Each drill runs real servers (redis-server, `floodgate serve` on the demo model) for longer and
harder than its test, and reports what the issue asks of every drill:

- over-admission: requests running at once beyond the tier's concurrency limit. The Redis drills
  drive the limiter in-process (bench/limiter_load.py), so the count is exact; through HTTP it is
  the user's slots on Redis, sampled every few ms (a peak between samples can be missed);
- leaked slots: the user's slots still on Redis once every request ended (after the settles'
  retries had their chance, bounded wait);
- leaked KV blocks: blocks (and sequences) the engine still holds once everything ended;
- lost messages: requests a replica answered whose question or reply is missing from the message
  store (a question is stored with its stream's first text);
- status counts: the HTTP answers (through the limiter in-process: admitted = 200, refused =
  429, store unavailable = 503);
- peak RSS: of the edge process (VmHWM), or of this process for the in-process drills.

Timings here are load shapes (how long an outage lasts, how long the flood runs), never pass/fail
conditions; the default run takes a few minutes on 2 cores (`--scale` stretches every duration).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import resource
import signal
import sqlite3
import statistics
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from redis import Redis as SyncRedis
from redis.asyncio import Redis

from bench.drill_serve import ServeProcess, serve_process
from bench.limiter_load import LimiterLoad
from bench.names import names_of
from bench.redis_process import RedisProcess
from bench.stalled_socket import CHAT, open_stalled
from gpu_container.engine.demo_model import build_demo_model
from limiter.redis_store import RedisLimiter, user_keys
from limiter.tiers import TierLimits

MODEL = "floodgate-tiny"
DRILL_USER = "drill-user"  # bench/drill_serve.py's paid key
BLOCK_TOKENS = 16  # [engine] block_size
SETTLE_WAIT_S = 30.0
PROMPT = [{"role": "user", "content": "hi"}]


@dataclass
class Report:
    drill: str
    what: str
    seconds: float = 0.0
    statuses: Counter[int] = field(default_factory=Counter)
    over_admitted: int | None = None
    leaked_slots: int | None = None
    leaked_kv_blocks: int | None = None
    lost_messages: int | None = None
    peak_rss_mib: float = 0.0
    notes: list[str] = field(default_factory=list)
    stream_errors: dict[str, int] = field(default_factory=dict)  # in-stream errors (drain)
    late_statuses: Counter[int] = field(default_factory=Counter)  # new requests during a drain

    @property
    def only_200_429(self) -> bool:
        return set(self.statuses) <= {200, 429}


# ---------------------------------------------------------------- the limiter against a failing Redis


async def _redis_drill(name: str, fault: str, limits: TierLimits, cycles: int, outage_s: float) -> Report:
    """12 callers on a tier of 4 slots through RedisLimiter while Redis is paused (SIGSTOP) or
    killed and restarted empty, `cycles` times, each outage `outage_s` long."""
    report = Report(
        name, f"{cycles} x Redis {fault} for {outage_s:g} s under load, fail-{limits.on_store_failure}"
    )
    servers = [RedisProcess.start()]
    limiter = RedisLimiter.from_url(servers[0].url, timeout_ms=100, backoff_s=0.05)
    load = LimiterLoad(limiter, limits, workers=12)
    started = time.monotonic()
    load.start()
    try:
        await load.admitted_more(50)
        for _ in range(cycles):
            if fault == "pause":
                servers[-1].pause()
                await asyncio.sleep(outage_s)  # the outage's length: the load shape, not a wait
                servers[-1].resume()
            else:
                servers[-1].kill()
                await asyncio.sleep(outage_s)
                servers.append(servers[-1].restart())
            await load.admitted_more(50)  # on Redis again
    finally:
        await load.stop()
    report.seconds = time.monotonic() - started
    try:
        report.leaked_slots = await _slots_after(limiter, servers[-1].url, load.user)
    finally:
        await limiter.aclose()
        for server in servers:
            server.kill()
    report.over_admitted = load.over_admitted
    report.statuses = Counter({200: load.admitted, 429: load.refused, 503: load.unavailable})
    report.statuses = +report.statuses
    report.peak_rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    report.notes.append(f"most running at once {load.most_running} of {limits.max_concurrent}")
    report.notes.append("in-process limiter: no engine, no messages")
    return report


async def _slots_after(limiter: RedisLimiter, url: str, user: str) -> int:
    """The user's slots left on Redis once the settle retries had up to SETTLE_WAIT_S to land."""
    probe = Redis.from_url(url)
    try:
        deadline = time.monotonic() + SETTLE_WAIT_S
        while True:
            slots = int(await probe.zcard(user_keys(user)[2]))
            if (slots == 0 and limiter.pending_settles == 0) or time.monotonic() > deadline:
                return slots
            await asyncio.sleep(0.01)
    finally:
        await probe.aclose()


# ---------------------------------------------------------------- floodgate serve under load


class SlotSampler(threading.Thread):
    """Samples the drill user's slots on Redis and the edge's RSS while a drill runs."""

    def __init__(self, redis_url: str, pid: int, every_s: float = 0.002) -> None:
        super().__init__(daemon=True)
        self._redis = SyncRedis.from_url(redis_url, socket_timeout=1)
        self._key = user_keys(DRILL_USER)[2]
        self._pid = pid
        self._every_s = every_s
        self._halt = threading.Event()
        self.peak_slots = 0
        self.peak_rss_kib = 0

    def run(self) -> None:
        while not self._halt.is_set():
            try:
                self.peak_slots = max(self.peak_slots, int(self._redis.zcard(self._key)))
                self.peak_rss_kib = max(self.peak_rss_kib, _status_kib(self._pid, "VmHWM"))
            except Exception:  # the edge exited, or Redis is being faulted: sample again later
                pass
            self._halt.wait(self._every_s)

    def stop(self) -> None:
        self._halt.set()
        self.join()
        self._redis.close()


def _status_kib(pid: int, name: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(name + ":"):
            return int(line.split()[1])
    return 0


@dataclass
class Answer:
    status: int
    request_id: str | None
    done: bool  # the stream ended with [DONE]
    error_code: str | None = None
    got_text: bool = False  # text came from a replica: its reply must be stored


async def _chat(client: httpx.AsyncClient, headers: dict[str, str], body: dict[str, Any]) -> Answer:
    body = body | {"conversation_id": f"drill-{uuid.uuid4().hex}"}
    try:
        async with client.stream("POST", CHAT, json=body, headers=headers) as response:
            done, code, text = False, None, False
            async for line in response.aiter_lines():
                if line == "data: [DONE]":
                    done = True
                elif line.startswith("data: {"):
                    chunk = json.loads(line.removeprefix("data: "))
                    if "error" in chunk:
                        code = chunk["error"].get("code")
                    text = text or any(c.get("delta", {}).get("content") for c in chunk.get("choices", []))
            return Answer(response.status_code, response.headers.get("x-request-id"), done, code, text)
    except httpx.HTTPError as exc:  # 0: no whole HTTP answer (a reset, a refusal, a cut stream)
        return Answer(0, None, False, type(exc).__name__)


def _engine(server: ServeProcess) -> list[dict[str, Any]]:
    replicas: list[dict[str, Any]] = httpx.get(server.ops_url + "/v1/internal/engine", timeout=10).json()[
        "replicas"
    ]
    return replicas


def _kv_blocks_left(server: ServeProcess) -> int:
    """Blocks the engine (and sequences the edge) still hold, once the health polls caught up."""
    deadline = time.monotonic() + SETTLE_WAIT_S
    while True:
        replicas = _engine(server)
        used = sum(int(r.get("kv_tokens_used", 0)) for r in replicas)
        held = sum(int(r["sequences_held"]) + int(r.get("running", 0)) for r in replicas)
        if (used == 0 and held == 0) or time.monotonic() > deadline:
            return math.ceil(used / BLOCK_TOKENS) + held
        time.sleep(0.1)  # the replica's state refreshes at its health poll


def _lost_messages(db: Path, answers: list[Answer]) -> tuple[int, str]:
    """Turns missing from the message store: the question and the reply of every request a
    replica answered (its stream carried text, or ended as a reply does). A question is stored at
    its stream's first text (edge/generation.py `_record_prompt`): one turned away after admission
    (queued past its wait, or still queued at the drain's deadline, or cut before any text)
    has neither, and the client's retry stores it once. Returns the count and a note."""
    with sqlite3.connect(db) as conn:
        stored = Counter((rid, role) for rid, role in conn.execute("SELECT request_id, role FROM messages"))
    answered = [a for a in answers if a.status == 200 and (a.got_text or (a.done and a.error_code is None))]
    expected = [(a.request_id, "user") for a in answered]
    expected += [(a.request_id, "assistant") for a in answered if a.got_text]
    missing = Counter(role for rid, role in expected if not stored[(rid, role)])
    # Stored for a request with no answer: a question its client's retry stores again (none expected).
    taken = {id(a) for a in answered}
    unanswered = sum(1 for a in answers if id(a) not in taken and stored[(a.request_id, "user")])
    return sum(missing.values()), (
        f"turns missing: {dict(missing)} of {len(expected)} expected; "
        f"questions of requests with no answer stored: {unanswered}"
    )


def _stop_gracefully(server: ServeProcess) -> int:
    server.proc.send_signal(signal.SIGTERM)
    return server.proc.wait(timeout=60)


@contextmanager
def _serve(
    workdir: Path, redis: RedisProcess, demo_dir: Path, sections: dict[str, dict[str, object]]
) -> Iterator[ServeProcess]:
    merged: dict[str, dict[str, object]] = {
        "limiter": {"backend": "redis", "redis_url": redis.url},
        "server": {"drain_accept_s": 0.0, "drain_deadline_s": 10.0},
    }
    for name, values in sections.items():
        merged[name] = merged.get(name, {}) | values
    with serve_process(workdir, merged, demo_dir) as server:
        yield server


@contextmanager
def _edge_on_redis(
    demo_dir: Path, sections: dict[str, dict[str, object]]
) -> Iterator[tuple[Path, RedisProcess, ServeProcess]]:
    """A work folder, a redis-server of its own and `floodgate serve` on both, each gone after."""
    with tempfile.TemporaryDirectory(prefix="floodgate-drill-") as tmp:
        redis = RedisProcess.start()
        try:
            with _serve(Path(tmp), redis, demo_dir, sections) as server:
                yield Path(tmp), redis, server
        finally:
            redis.kill()


async def _loop_clients(
    server: ServeProcess, clients: int, seconds: float, body: dict[str, Any]
) -> list[Answer]:
    """`clients` callers, each sending `body` (streamed) again and again for `seconds`."""
    answers: list[Answer] = []
    deadline = time.monotonic() + seconds
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=server.base_url, timeout=120.0, limits=limits) as client:

        async def caller() -> None:
            while time.monotonic() < deadline:
                answers.append(await _chat(client, server.auth(), body))

        await asyncio.gather(*(caller() for _ in range(clients)))
    return answers


def _http_report(
    report: Report,
    server: ServeProcess,
    sampler: SlotSampler,
    redis: RedisProcess,
    answers: list[Answer],
    limit: int,
    workdir: Path,
) -> None:
    report.statuses = Counter(a.status for a in answers)
    report.over_admitted = max(0, sampler.peak_slots - limit)
    report.leaked_kv_blocks = _kv_blocks_left(server)
    probe = SyncRedis.from_url(redis.url)
    deadline = time.monotonic() + SETTLE_WAIT_S
    while (slots := int(probe.zcard(user_keys(DRILL_USER)[2]))) and time.monotonic() < deadline:
        time.sleep(0.05)
    report.leaked_slots = slots
    probe.close()
    sampler.stop()
    report.peak_rss_mib = max(sampler.peak_rss_kib, _status_kib(server.proc.pid, "VmHWM")) / 1024
    exit_code = _stop_gracefully(server)
    report.lost_messages, turns = _lost_messages(workdir / "messages.db", answers)
    report.notes.append(f"peak slots {sampler.peak_slots} of {limit}; exit {exit_code}")
    if report.lost_messages:
        report.notes.append(turns)


async def overload(demo_dir: Path, seconds: float) -> Report:
    """10x more streams than the edge holds (`max_open_streams` 16, 160 callers), for `seconds`."""
    capacity, limit = 16, 24
    report = Report("overload", f"160 callers (10x the 16 streams held), each in a loop for {seconds:g} s")
    sections: dict[str, dict[str, object]] = {
        "server": {"max_open_streams": capacity},
        "engine": {"max_num_seqs": 4},
        "tiers.paid": {"max_concurrent": limit, "requests_per_window": 10**7},
    }
    body = {"model": MODEL, "messages": PROMPT, "max_tokens": 32, "stream": True}
    with _edge_on_redis(demo_dir, sections) as (workdir, redis, server):
        sampler = SlotSampler(redis.url, server.proc.pid)
        sampler.start()
        started = time.monotonic()
        answers = await _loop_clients(server, 10 * capacity, seconds, body)
        report.seconds = time.monotonic() - started
        _http_report(report, server, sampler, redis, answers, limit, workdir)
    codes = Counter(a.error_code for a in answers if a.status == 200 and not a.done)
    report.notes.append(f"200s without [DONE]: {sum(codes.values())}")
    transport = Counter(a.error_code for a in answers if a.status == 0)
    if transport:
        report.notes.append(f"no HTTP answer: {dict(transport)}")
    return report


async def redis_hang(demo_dir: Path, seconds: float, hang_s: float) -> Report:
    """8 callers streaming short replies through the edge while its Redis hangs (SIGSTOP) for
    `hang_s` in the middle of `seconds`: the fail-open tier's answers and their latency then, as a
    client sees them (the whole request, its first byte to its last)."""
    clients = 8
    report = Report(
        "redis-hang",
        f"{clients} callers through the edge, Redis paused {hang_s:g} s of {seconds:g} s, fail-open",
    )
    limit = 16
    sections: dict[str, dict[str, object]] = {
        "tiers.paid": {"max_concurrent": limit, "requests_per_window": 10**7}
    }
    body = {"model": MODEL, "messages": PROMPT, "max_tokens": 2, "stream": True}
    timed: list[tuple[float, float, Answer]] = []  # (sent at, took, answer)
    hang_from = (seconds - hang_s) / 2
    with _edge_on_redis(demo_dir, sections) as (workdir, redis, server):
        sampler = SlotSampler(redis.url, server.proc.pid)
        sampler.start()
        started = time.monotonic()
        async with httpx.AsyncClient(base_url=server.base_url, timeout=120.0) as client:

            async def caller() -> None:
                while (sent := time.monotonic()) - started < seconds:
                    answer = await _chat(client, server.auth(), body)
                    timed.append((sent - started, time.monotonic() - sent, answer))

            async def hang() -> None:
                await asyncio.sleep(hang_from)  # the load's shape, not a wait for anything
                redis.pause()
                await asyncio.sleep(hang_s)
                redis.resume()

            await asyncio.gather(hang(), *(caller() for _ in range(clients)))
        report.seconds = time.monotonic() - started
        _http_report(report, server, sampler, redis, [a for _, _, a in timed], limit, workdir)
    during = sorted(took * 1000 for sent, took, _ in timed if hang_from <= sent < hang_from + hang_s)
    if during:
        p99 = during[min(len(during) - 1, int(0.99 * len(during)))]
        report.notes.append(
            f"sent during the hang: {len(during)}, ms p50 {statistics.median(during):.0f} / p99 {p99:.0f} / "
            f"max {during[-1]:.0f}, over 1 s: {sum(1 for ms in during if ms > 1000)}"
        )
    return report


def _long_seed(server: ServeProcess, max_tokens: int) -> int:
    """A seed with which PROMPT runs to max_tokens (sampling is seeded, so it will again)."""
    body = {"model": MODEL, "messages": PROMPT, "max_tokens": max_tokens}
    seeds: tuple[int, ...] = (6, *range(6), *range(7, 40))
    for seed in seeds:
        answer = httpx.post(
            server.base_url + CHAT, json=body | {"seed": seed}, headers=server.auth(), timeout=120
        )
        if answer.json()["choices"][0]["finish_reason"] == "length":
            return seed
    raise RuntimeError("no seed makes the demo model run long")


async def drain(demo_dir: Path, streams: int) -> Report:
    """SIGTERM with `streams` long streams in flight on a replica of 4 sequences: the drain window
    turns new requests away (503), running streams end with [DONE], those still running at the
    deadline with an error event; the process exits 0."""
    limit = streams + 8
    report = Report(
        "drain", f"SIGTERM with {streams} long streams in flight (4 run at once, the rest queued)"
    )
    sections: dict[str, dict[str, object]] = {
        "server": {"drain_accept_s": 2.0, "drain_deadline_s": 4.0},
        "engine": {"max_num_seqs": 4},
        "tiers.paid": {"max_concurrent": limit, "requests_per_window": 10**7},
    }
    with tempfile.TemporaryDirectory(prefix="floodgate-drill-") as tmp:
        redis = RedisProcess.start()
        try:
            with _serve(Path(tmp), redis, demo_dir, sections) as server:
                seed = _long_seed(server, 400)
                sampler = SlotSampler(redis.url, server.proc.pid)
                sampler.start()
                body = {"model": MODEL, "messages": PROMPT, "max_tokens": 400, "seed": seed, "stream": True}
                started = time.monotonic()
                limits = httpx.Limits(max_connections=streams + 8)
                async with httpx.AsyncClient(
                    base_url=server.base_url, timeout=120.0, limits=limits
                ) as client:
                    running = [
                        asyncio.create_task(_chat(client, server.auth(), body)) for _ in range(streams)
                    ]
                    # SIGTERM once every stream holds its slot (all admitted): a condition, polled.
                    while sampler.peak_slots < streams and not any(t.done() for t in running):  # noqa: ASYNC110
                        await asyncio.sleep(0.01)  # the sampler is a thread: nothing to await on
                    server.proc.send_signal(signal.SIGTERM)
                    # The drain begins at the server's next tick (edge/server.py): a request sent
                    # before it is served as usual. Once /readyz says so, the window that still
                    # accepts connections must turn new requests away with a 503, all at once.
                    while (await client.get("/readyz")).status_code != 503:  # noqa: ASYNC110
                        await asyncio.sleep(0.01)  # a condition on the server, polled
                    late = list(
                        await asyncio.gather(
                            *(_chat(client, server.auth(), body | {"max_tokens": 4}) for _ in range(5))
                        )
                    )
                    answers = list(await asyncio.gather(*running))
                exit_code = server.proc.wait(timeout=60)
                report.seconds = time.monotonic() - started
                sampler.stop()
                report.peak_rss_mib = sampler.peak_rss_kib / 1024
        finally:
            probe = SyncRedis.from_url(redis.url)
            report.leaked_slots = int(probe.zcard(user_keys(DRILL_USER)[2]))
            probe.close()
            redis.kill()
        report.statuses = Counter(a.status for a in answers)
        report.over_admitted = max(0, sampler.peak_slots - limit)
        report.lost_messages, turns = _lost_messages(Path(tmp) / "messages.db", answers)
        report.notes.append(turns)  # the streams cut while queued leave no question: said either way
        tracebacks = server.output().count("Traceback")
    cut = sum(1 for a in answers if a.error_code == "server_shutting_down")
    other = Counter(a.error_code for a in answers if a.error_code not in (None, "server_shutting_down"))
    report.stream_errors = {str(code): n for code, n in other.items()}
    report.notes += [
        f"streams ended with [DONE] {sum(a.done for a in answers)} of {streams}, {cut} cut at the deadline"
        + (f", other errors {dict(other)}" if other else ""),
        f"new requests during the drain: {dict(Counter(a.status for a in late))}",
        f"exit {exit_code}, tracebacks {tracebacks}; KV: the engine exits with the edge",
    ]
    report.late_statuses = Counter(a.status for a in late)
    report.statuses += report.late_statuses
    return report


def _metric(server: ServeProcess, name: str) -> float:
    for line in httpx.get(server.ops_url + "/metrics", timeout=10).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


async def slow_readers(demo_dir: Path, readers: int, seconds: float) -> Report:
    """`readers` long streams that are never read, beside 16 ordinary callers for `seconds`: each
    stalled reader is cut after `stalled_reader_s` and its sequence and slot freed."""
    limit = readers + 16
    report = Report(
        "slow-readers", f"{readers} stalled readers beside 16 callers in a loop for {seconds:g} s"
    )
    sections: dict[str, dict[str, object]] = {
        "server": {"stalled_reader_s": 2.0, "send_buffer_bytes": 4096},
        "tiers.paid": {"max_concurrent": limit, "requests_per_window": 10**7},
    }
    with _edge_on_redis(demo_dir, sections) as (workdir, redis, server):
        seed = _long_seed(server, 1000)
        sampler = SlotSampler(redis.url, server.proc.pid)
        sampler.start()
        long_body = {
            "model": MODEL,
            "messages": PROMPT,
            "max_tokens": 1000,
            "seed": seed,
            "stream": True,
        }
        started = time.monotonic()
        sockets = [open_stalled(server.base_url, server.key, long_body) for _ in range(readers)]
        try:
            body = {"model": MODEL, "messages": PROMPT, "max_tokens": 32, "stream": True}
            answers = await _loop_clients(server, 16, seconds, body)
            cut_deadline = time.monotonic() + SETTLE_WAIT_S
            while _metric(server, "floodgate_stalled_readers_cut_total") < readers:
                if time.monotonic() > cut_deadline:
                    break
                await asyncio.sleep(0.1)
            cut = _metric(server, "floodgate_stalled_readers_cut_total")
            report.seconds = time.monotonic() - started
            _http_report(report, server, sampler, redis, answers, limit, workdir)
        finally:
            for sock in sockets:
                sock.close()
    report.notes.append(f"stalled readers cut {cut:g} of {readers}")
    return report


# ---------------------------------------------------------------- the report


def _row(r: Report) -> str:
    def figure(value: int | None) -> str:
        return "n/a" if value is None else str(value)

    statuses = ", ".join(f"{code}: {n}" for code, n in sorted(r.statuses.items()))
    return (
        f"| {r.drill} | {r.what} | {r.seconds:.0f} | {figure(r.over_admitted)} | {figure(r.leaked_slots)} | "
        f"{figure(r.leaked_kv_blocks)} | {figure(r.lost_messages)} | {statuses} | {r.peak_rss_mib:.0f} | "
        f"{'; '.join(r.notes)} |"
    )


def table(reports: list[Report]) -> str:
    lines = [
        "| drill | load | s | over-admitted | slots leaked | KV blocks leaked | messages lost | statuses "
        "| peak RSS MiB | notes |",
        "|---|---|---:|---:|---:|---:|---:|---|---:|---|",
    ]
    return "\n".join([*lines, *(_row(r) for r in reports)])


def failures(reports: list[Report]) -> list[str]:
    """What the issue forbids, per drill (the in-process Redis drills may answer 503: fail-closed)."""
    found = []
    for r in reports:
        for label, value in (
            ("over-admitted", r.over_admitted),
            ("slots leaked", r.leaked_slots),
            ("KV blocks leaked", r.leaked_kv_blocks),
            ("messages lost", r.lost_messages),
        ):
            if value:
                found.append(f"{r.drill}: {label} {value}")
        if r.drill in ("overload", "redis-hang") and not r.only_200_429:
            found.append(f"{r.drill}: statuses other than 200 and 429: {dict(r.statuses)}")
        if r.drill == "drain" and r.stream_errors:
            found.append(f"drain: streams ended by something else than the drain: {r.stream_errors}")
        if r.drill == "drain" and set(r.late_statuses) - {503}:
            found.append(f"drain: new requests during the drain not turned away: {dict(r.late_statuses)}")
    return found


def _tier(on_failure: str) -> TierLimits:
    return TierLimits(
        requests_per_window=10**6,
        request_window_s=60.0,
        tokens_per_window=10**7,
        token_window_s=60.0,
        max_concurrent=4,
        max_tokens=4096,
        on_store_failure="open" if on_failure == "open" else "closed",
    )


DRILLS: dict[str, Callable[[Path, float], list[Awaitable[Report]]]] = {
    "redis-pause": lambda _, k: [
        _redis_drill("redis-pause", "pause", _tier(f), max(1, round(5 * k)), 1.5) for f in ("open", "closed")
    ],
    "redis-kill": lambda _, k: [
        _redis_drill("redis-kill", "kill", _tier(f), max(1, round(10 * k)), 1.0) for f in ("open", "closed")
    ],
    "redis-hang": lambda demo, k: [redis_hang(demo, 12 * k, 6 * k)],
    "overload": lambda demo, k: [overload(demo, 30 * k)],
    "drain": lambda demo, k: [drain(demo, max(8, round(64 * k)))],
    "slow-readers": lambda demo, k: [slow_readers(demo, max(4, round(20 * k)), 20 * k)],
}


async def run(only: list[str], scale: float, demo_dir: Path) -> list[Report]:
    reports = []
    for name in only:
        for drill in DRILLS[name](demo_dir, scale):
            reports.append(await drill)
            print(_row(reports[-1]), flush=True)
    return reports


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.drills", description=(__doc__ or "").split("\n")[0]
    )
    parser.add_argument("--scale", type=float, default=1.0, help="stretch every duration and count")
    parser.add_argument(
        "--only", default=",".join(DRILLS), type=names_of(DRILLS), help="comma-separated drill names"
    )
    args = parser.parse_args(argv)
    started = time.monotonic()
    demo_dir = build_demo_model(Path(".floodgate/demo-model").resolve())
    reports = asyncio.run(run(args.only.split(","), args.scale, demo_dir))
    print()
    print(table(reports))
    found = failures(reports)
    print(
        f"\n{len(reports)} drills in {time.monotonic() - started:.0f} s: " + ("; ".join(found) or "all held")
    )
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main())
