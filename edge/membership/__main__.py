"""A stand-in edge instance for tests and demos: the real membership loop against a real Redis,
printing its view (one JSON line per change, with a wall-clock time) until SIGTERM, then draining
over `--drain-s` (its claim falls linearly, as open streams end) and leaving.

    python -m edge.membership --redis redis://127.0.0.1:6379/0 --id edge-a [--interval 5 --ttl 15]

`--redis redis+cluster://HOST:PORT` joins through a Redis Cluster (limiter/redis_url.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import time
from dataclasses import asdict

import structlog

from edge.membership.membership import FleetMembership, MembershipSettings
from edge.membership.shares import FleetView
from limiter import redis_url


def _print(member: str, view: FleetView) -> None:
    sys.stdout.write(json.dumps({"id": member, "t": time.time(), **asdict(view)}) + "\n")
    sys.stdout.flush()


async def _main(args: argparse.Namespace) -> None:
    # Views on stdout, one JSON line each; logs go to stderr.
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    settings = MembershipSettings(
        instance_count=args.instance_count,
        interval_s=args.interval,
        join_wait_s=2 * args.interval,
        ttl_s=args.ttl,
        stale_after_s=args.stale_after,
        fleet=args.fleet,
    )
    # redis://… or redis+cluster://…, read as the edge reads its limiter's URL.
    client = redis_url.connect(args.redis, socket_timeout=args.interval, socket_connect_timeout=args.interval)
    membership = FleetMembership(client, args.id, settings, lambda v: _print(args.id, v))
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await membership.start()
    await stop.wait()
    started = time.monotonic()
    membership.begin_drain(lambda: 1.0 - (time.monotonic() - started) / args.drain_s)
    await asyncio.sleep(args.drain_s)  # the loop keeps beating: the claim falls at each beat
    await membership.aclose()
    _print(args.id, FleetView(0, 0.0, 0.0, 0.0, 0, "left"))
    await client.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--redis", required=True)
    parser.add_argument("--id", required=True)
    parser.add_argument("--interval", type=float, default=5.0)
    parser.add_argument("--ttl", type=float, default=15.0)
    parser.add_argument("--stale-after", type=float, default=30.0)
    parser.add_argument("--instance-count", type=int, default=1)
    parser.add_argument("--drain-s", type=float, default=1.0)
    parser.add_argument("--fleet", default="edges")
    asyncio.run(_main(parser.parse_args()))


if __name__ == "__main__":
    main()
