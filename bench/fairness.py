"""Paid time-to-first-token while a free-tier flood saturates the engines, next to an idle system.

Drives the admission Dispatcher and real in-process engines (the demo model) directly, not the HTTP
edge: what is measured is the queue in front of the GPUs, without the network, auth or the limiter.
One run, three phases on the same engines:

1. idle: a trickle of paid requests alone;
2. flood: free clients, `flood_factor` times as many as the replicas' sequence slots, each sending
   request after request (backing off as told when turned away), and the same paid trickle;
3. flood, no tiers: the same again with paid requests queued as if free (same priority, no reserve),
   to show what the tiers buy.

    .venv/bin/python -m bench.fairness [--paid 60] [--flood-factor 10] [--out docs/bench-fairness.md]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import itertools
import os
import platform
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from edge.admission import Dispatcher, Overloaded, Ticket
from edge.upstreams.base import GenerationRequest, Upstream
from gpu_container.engine.async_engine import AsyncEngine
from gpu_container.engine.demo_model import build_demo_model
from gpu_container.engine.engine import LLMEngine
from gpu_container.engine.types import EngineConfig

PAID_PRIORITY, FREE_PRIORITY = 10, 0
BENCH_ENGINE = EngineConfig(
    block_size=16, num_blocks=256, max_num_seqs=16, max_num_batched_tokens=512, max_model_len=1024
)


@dataclass(frozen=True)
class BenchConfig:
    replicas: int = 2
    engine: EngineConfig = field(default_factory=lambda: BENCH_ENGINE)
    prompt_tokens: int = 64
    max_new_tokens: int = 64
    flood_factor: int = 10
    paid_requests: int = 60
    paid_interval_s: float = 0.1
    reserved_paid_fraction: float = 0.2
    free_max_wait_s: float = 30.0
    paid_max_wait_s: float = 120.0

    @property
    def flood_clients(self) -> int:
        return self.flood_factor * self.replicas * self.engine.max_num_seqs


@dataclass
class PhaseResult:
    name: str
    paid_ttft_s: list[float] = field(default_factory=list)
    free_ttft_s: list[float] = field(default_factory=list)
    free_waits: list[tuple[float, float]] = field(default_factory=list)  # (estimated, real), queued ones
    free_completed: int = 0
    free_rejected: Counter[str] = field(default_factory=Counter)
    measuring: bool = False
    measured_open: int = 0
    warmup_completed: int = 0
    peak_queue: int = 0
    wall_s: float = 0.0


_ids = itertools.count()


def _ticket(user: str, paid: bool, config: BenchConfig) -> Ticket:
    return Ticket(
        request_id=f"bench-{next(_ids)}",
        user=user,
        priority=PAID_PRIORITY if paid else FREE_PRIORITY,
        kv_tokens=config.prompt_tokens + config.max_new_tokens,
        max_wait_s=config.paid_max_wait_s if paid else config.free_max_wait_s,
        may_use_reserve=paid,
        tier="paid" if paid else "free",
    )


@dataclass(frozen=True)
class Timing:
    ttft_s: float
    estimated_wait_s: float  # what the dispatcher predicted at precheck
    queued_s: float  # what the request really waited for its slot


async def _one_request(dispatcher: Dispatcher, ticket: Ticket, config: BenchConfig) -> Timing:
    """precheck → acquire → generate → release, as the edge does."""
    started = time.perf_counter()
    estimate = dispatcher.estimate_wait_s(ticket)
    dispatcher.precheck(ticket)
    slot = await dispatcher.acquire(ticket)
    queued = time.perf_counter() - started
    ttft: float | None = None
    prompt = [(i * 7 + 11) % 900 + 3 for i in range(config.prompt_tokens)]
    request = GenerationRequest(
        ticket.request_id, prompt, config.max_new_tokens, temperature=0.0, priority=ticket.priority
    )
    generated = 0
    try:
        async for delta in slot.upstream.generate(request):
            if ttft is None and delta.token_ids:
                ttft = time.perf_counter() - started
            # As the edge's relay does: without a first token the slot is given back "unused",
            # and the dispatcher learns no service time from it (its wait estimate stays the prior).
            generated += len(delta.token_ids)
            slot.grow(generated)
        slot.mark_finished()
    finally:
        slot.release()
    return Timing(ttft if ttft is not None else time.perf_counter() - started, estimate, queued)


async def _free_client(dispatcher: Dispatcher, user: str, config: BenchConfig, result: PhaseResult) -> None:
    while True:
        # Only requests that start inside the measured window count, and the window closes only
        # when all of them are done: a short window would otherwise keep just the short waits.
        measured = result.measuring
        result.measured_open += measured
        try:
            timing = await _one_request(dispatcher, _ticket(user, False, config), config)
        except Overloaded as exc:
            if measured:
                result.free_rejected[exc.reason] += 1
            await asyncio.sleep(min(exc.retry_after_s, 1.0))
            continue
        finally:
            result.measured_open -= measured
        if not measured:
            result.warmup_completed += 1
            continue
        result.free_ttft_s.append(timing.ttft_s)
        if timing.estimated_wait_s > 0:
            result.free_waits.append((timing.estimated_wait_s, timing.queued_s))
        result.free_completed += 1


async def _paid_trickle(
    dispatcher: Dispatcher, config: BenchConfig, result: PhaseResult, as_free: bool
) -> None:
    async def one(i: int) -> None:
        ticket = _ticket(f"paid-{i % 5}", True, config)
        if as_free:
            ticket = dataclasses.replace(ticket, priority=FREE_PRIORITY, may_use_reserve=False)
        result.paid_ttft_s.append((await _one_request(dispatcher, ticket, config)).ttft_s)

    async with asyncio.TaskGroup() as group:
        for i in range(config.paid_requests):
            group.create_task(one(i))
            await asyncio.sleep(config.paid_interval_s)


@contextlib.asynccontextmanager
async def _dispatcher(
    upstreams: list[Upstream], config: BenchConfig, reserve: float
) -> AsyncIterator[Dispatcher]:
    dispatcher = Dispatcher(
        upstreams,
        reserved_paid_fraction=reserve,
        max_queue=config.flood_clients * 2,
        kv_block_tokens=config.engine.block_size,
    )
    await dispatcher.start()
    try:
        yield dispatcher
    finally:
        await dispatcher.aclose()


async def _phase(
    name: str, upstreams: list[Upstream], config: BenchConfig, *, flood: bool, tiers: bool
) -> PhaseResult:
    result = PhaseResult(name)
    started = time.perf_counter()
    async with _dispatcher(upstreams, config, config.reserved_paid_fraction if tiers else 0.0) as dispatcher:
        flooders: list[asyncio.Task[None]] = []
        if flood:
            for i in range(config.flood_clients):
                user = f"free-{i % 50}"
                flooders.append(asyncio.create_task(_free_client(dispatcher, user, config, result)))
            # Warm-up: saturated, and a whole batch per replica turned over, so the dispatcher's
            # service times are measured ones, not its prior. Then measure.
            await _until(lambda: dispatcher.queue_depth() >= config.flood_clients // 2)
            slots = config.replicas * config.engine.max_num_seqs
            await _until(lambda: result.warmup_completed >= slots)
        result.measuring = True
        watcher = asyncio.create_task(_watch_queue(dispatcher, result))
        await _paid_trickle(dispatcher, config, result, as_free=not tiers)
        result.measuring = False
        await _until(lambda: result.measured_open == 0)
        watcher.cancel()
        for task in flooders:
            task.cancel()
        await asyncio.gather(watcher, *flooders, return_exceptions=True)
    result.wall_s = time.perf_counter() - started
    return result


async def _until(predicate: Callable[[], bool], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("the flood did not saturate the replicas")
        await asyncio.sleep(0.01)


async def _watch_queue(dispatcher: Dispatcher, result: PhaseResult) -> None:
    while True:
        result.peak_queue = max(result.peak_queue, dispatcher.queue_depth())
        await asyncio.sleep(0.05)


def _start_replicas(model_dir: Path, config: BenchConfig) -> list[AsyncEngine]:
    replicas = []
    for i in range(config.replicas):
        engine = LLMEngine.from_pretrained(model_dir, config.engine)
        engine.start()
        replicas.append(AsyncEngine(engine, f"engine-{i}"))
    return replicas


async def run(config: BenchConfig) -> list[PhaseResult]:
    model_dir = build_demo_model(Path(tempfile.gettempdir()) / "floodgate-bench-demo-model")
    replicas = _start_replicas(model_dir, config)
    upstreams: list[Upstream] = list(replicas)
    for replica in replicas:  # one-time costs (first allocations, BLAS start-up) stay out of the numbers
        async for _ in replica.generate(GenerationRequest("bench-warm-up", [5, 6, 7], 4)):
            pass
    try:
        return [
            await _phase("idle", upstreams, config, flood=False, tiers=True),
            await _phase("free flood, tiers on", upstreams, config, flood=True, tiers=True),
            await _phase("free flood, no tiers", upstreams, config, flood=True, tiers=False),
        ]
    finally:
        for replica in replicas:
            await replica.aclose()


def _ms(values: list[float], q: float) -> str:
    if not values:
        return "-"
    return f"{float(np.percentile(values, q)) * 1000:.0f}"


def _reasons(rejected: Counter[str]) -> str:
    return ", ".join(f"{n} {reason}" for reason, n in rejected.most_common()) or "0"


def _accuracy(waits: list[tuple[float, float]]) -> str:
    if not waits:
        return "-"
    return f"{statistics.median(real / estimated for estimated, real in waits):.2f}"


def render(config: BenchConfig, results: list[PhaseResult]) -> str:
    rows = [
        "| phase | paid n | paid TTFT p50 (ms) | paid TTFT p99 (ms) | free TTFT p50 (ms) | free completed |"
        " free 429 | peak queue | free real/estimated wait p50 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        rows.append(
            f"| {r.name} | {len(r.paid_ttft_s)} | {_ms(r.paid_ttft_s, 50)} | {_ms(r.paid_ttft_s, 99)} |"
            f" {_ms(r.free_ttft_s, 50)} | {r.free_completed} | {_reasons(r.free_rejected)} | {r.peak_queue} |"
            f" {_accuracy(r.free_waits)} |"
        )
    return "\n".join(rows)


def machine() -> str:
    cpu = platform.processor() or "unknown CPU"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return (
        f"{cpu}, {os.cpu_count()} cores, {platform.system()} {platform.release()}, "
        f"Python {sys.version.split()[0]}, numpy {np.__version__}"
    )


def report(config: BenchConfig, results: list[PhaseResult]) -> str:
    e = config.engine
    slots = config.replicas * e.max_num_seqs
    idle, flood = results[0], results[1]
    ratio = statistics.median(flood.paid_ttft_s) / statistics.median(idle.paid_ttft_s)
    return f"""# Fairness benchmark: paid TTFT under a free-tier flood

`.venv/bin/python -m bench.fairness` — {datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")}

Machine: {machine()}. Load average {os.getloadavg()[0]:.1f} when it finished: other work on the
machine shows up as noise in every row.

Setup:
- the admission `Dispatcher` in front of {config.replicas} in-process CPU engines (the demo model),
  driven directly: no HTTP edge, no limiter;
- engine: {e.num_blocks} KV blocks of {e.block_size} tokens, {e.max_num_seqs} sequences;
- requests: {config.prompt_tokens} prompt tokens, {config.max_new_tokens} new tokens;
- flood: {config.flood_clients} free clients ({config.flood_factor}x the {slots} sequence slots) from
  50 users, each sending request after request;
- paid: {config.paid_requests} requests from 5 users, one every {config.paid_interval_s * 1000:.0f} ms;
  reserve for paid: {config.reserved_paid_fraction:.0%};
- TTFT: from precheck to the first token;
- the flood warms up first (saturated, and one batch per replica completed, so the dispatcher's
  service times are measured, not its prior); free figures count the requests started while the
  paid trickle ran, each followed to its end.

{render(config, results)}

With tiers on, paid p50 TTFT under the flood is {ratio:.1f}x its idle value: paid requests skip the
queue and land in the reserved share, so what is left is the engine's step time with a full batch
and an event loop busy with the flood.
The last row queues paid requests like free ones (same priority, no reserve): they wait behind the
flood, which is what the tiers remove.

The last column checks the wait estimate behind `precheck` (and so behind Retry-After): the real
queue wait of free requests over the estimate made when they arrived (1.0 is exact). The estimate
counts the queue as it stands; paid requests arriving later jump ahead of a waiting free one, and
other load on the machine slows the engines after the estimate, so free requests wait longer than
estimated by about that much. `acquire` still bounds every wait at the tier's max_queue_wait_s.
"""


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--paid", type=int, default=BenchConfig.paid_requests)
    parser.add_argument("--flood-factor", type=int, default=BenchConfig.flood_factor)
    parser.add_argument("--replicas", type=int, default=BenchConfig.replicas)
    parser.add_argument("--out", type=Path, default=Path("docs/bench-fairness.md"))
    args = parser.parse_args(argv)
    config = BenchConfig(replicas=args.replicas, flood_factor=args.flood_factor, paid_requests=args.paid)
    results = asyncio.run(run(config))
    print(render(config, results))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(report(config, results))
    print(f"\nwritten to {args.out}")


if __name__ == "__main__":
    main()
