"""How fast the usage writer gets rows of distinct users into DynamoDB (dynalite, started here), one
row at a time against `parallel_writes` at a time, in one run.

dynalite answers on loopback in well under a millisecond of network; DynamoDB in the region takes a
few. `--rtt-ms` adds that round trip inside each write's thread (where boto3 would wait for it), so
the figure is what a writer could keep up with in production, not dynalite's CPU.

    python -m bench.usage_writer [--rows 1000] [--rtt-ms 0,6] [--rounds 2]

One JSON object per (rtt, parallel_writes, round): rows, seconds, rows per second."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import time
from typing import Any

from edge.dynamodb_client import dynamodb_client
from edge.keys.dynamodb import create_table_if_missing
from edge.usage.dynamodb import DynamoDBUsageStore
from edge.usage.record import Usage
from edge.usage.store import WriteId
from edge.usage.writer import UsageWriter
from tests.messages.dynalite import running_dynalite


class FarStore(DynamoDBUsageStore):
    """The DynamoDB store with a network round trip added to each write, and a parallelism set."""

    def __init__(self, client: Any, table: str, rtt_s: float, parallel_writes: int) -> None:
        super().__init__(client, table)
        self._rtt_s = rtt_s
        self.parallel_writes = parallel_writes

    def _add(self, u: Usage, write: WriteId) -> bool:
        time.sleep(self._rtt_s)  # in the write's thread, as boto3 waits for the answer
        return super()._add(u, write)


async def one_run(endpoint: str, rows: int, rtt_s: float, parallel_writes: int) -> float:
    """Seconds from the first row recorded until every row is in the store."""
    client = dynamodb_client(endpoint)
    table = f"usage-{secrets.token_hex(4)}"
    create_table_if_missing(client, table)
    store = FarStore(client, table, rtt_s, parallel_writes)
    writer = UsageWriter(store, rows, gather_s=0.0, drain_timeout_s=600.0)
    writer.start()
    began = time.perf_counter()
    for i in range(rows):
        writer.record(f"user-{i}", "model", 10, 20)
    await writer.flush()
    took = time.perf_counter() - began
    await writer.aclose()
    written = await store.query()
    assert len(written) == rows, f"{len(written)} of {rows} rows written"
    await store.aclose()
    return took


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--rtt-ms", default="0,6", help="round trips to add, comma-separated")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        os.environ.setdefault(name, "test")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    with running_dynalite() as endpoint:
        for rtt_ms in (float(v) for v in args.rtt_ms.split(",")):
            for round_ in range(args.rounds):
                # Alternated within each round: one at a time (the writer before), then the store's.
                for parallel in (1, DynamoDBUsageStore.parallel_writes):
                    took = asyncio.run(one_run(endpoint, args.rows, rtt_ms / 1000, parallel))
                    print(
                        json.dumps(
                            {
                                "rtt_ms": rtt_ms,
                                "parallel_writes": parallel,
                                "round": round_,
                                "rows": args.rows,
                                "seconds": round(took, 3),
                                "rows_per_s": round(args.rows / took, 1),
                            }
                        ),
                        flush=True,
                    )


if __name__ == "__main__":
    main()
