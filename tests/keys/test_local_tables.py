"""At a local DynamoDB-compatible endpoint nobody ran Terraform for, the edge makes its tables at
start: every worker of `floodgate serve --workers N` does, at once, on a first start."""

from __future__ import annotations

import contextlib
import secrets
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest

from edge.keys.dynamodb import create_table_if_missing
from edge.messages.dynamodb import DynamoDBMessageStore
from tests.support.moto_server import aws_client, running_moto

WORKERS = 4


def _key_table(endpoint: str, table: str) -> Callable[[], None]:
    client = aws_client("dynamodb", endpoint)
    return lambda: create_table_if_missing(client, table)


def _message_table(endpoint: str, table: str) -> Callable[[], None]:
    store = DynamoDBMessageStore(aws_client("dynamodb", endpoint), table)
    return store._create_table_if_missing


@pytest.mark.parametrize("maker", [_key_table, _message_table], ids=["keys", "messages"])
def test_workers_making_a_missing_table_at_once_all_start(
    maker: Callable[[str, str], Callable[[], None]],
) -> None:
    """Each worker asked whether the table was there, found none, and made it: all but the first
    were refused ResourceInUseException, and their edges failed at start (with a dev key the
    serve's own parent makes the key table first; the messages table no one makes before)."""
    # A name of its own: moto's tables outlive its server, in this process.
    table = f"first-start-{secrets.token_hex(4)}"
    with running_moto() as endpoint:
        makes = [maker(endpoint, table) for _ in range(WORKERS)]
        together = threading.Barrier(WORKERS)

        def start(make: Callable[[], None]) -> None:
            together.wait()  # every worker asks before any has made it
            make()

        tables = aws_client("dynamodb", endpoint)
        try:
            with ThreadPoolExecutor(WORKERS) as pool:
                started = [pool.submit(start, make) for make in makes]
                failures = [repr(future.exception()) for future in started if future.exception()]
            described = tables.describe_table(TableName=table)["Table"]
        finally:
            # Gone with the test: another's moto server lists the tables of this process.
            with contextlib.suppress(tables.exceptions.ResourceNotFoundException):
                tables.delete_table(TableName=table)

    assert failures == []
    assert described["TableStatus"] == "ACTIVE"
