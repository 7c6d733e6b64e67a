"""Message-store fixtures: every store test runs against SQLite and against DynamoDB (dynalite)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import boto3
import pytest

from edge.messages.dynamodb import DynamoDBMessageStore
from edge.messages.sqlite import SQLiteMessageStore
from edge.messages.store import MessageStore
from tests.messages.dynalite import DynaliteUnavailable, ensure_installed, running_dynalite

TABLE = "floodgate-messages-test"


@pytest.fixture(scope="session")
def dynalite_endpoint() -> Iterator[str]:
    try:
        ensure_installed()
    except DynaliteUnavailable as why:
        pytest.skip(str(why))
    with running_dynalite() as endpoint:
        yield endpoint


def dynamodb_store(endpoint: str, table: str = TABLE) -> DynamoDBMessageStore:
    client = boto3.client(
        "dynamodb",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="test",
        aws_secret_access_key="test",
    )
    return DynamoDBMessageStore(client, table)


@pytest.fixture(params=["sqlite", "dynamodb"])
def store_endpoint(request: pytest.FixtureRequest) -> str | None:
    """None for SQLite; the dynalite endpoint for DynamoDB."""
    if request.param == "sqlite":
        return None
    endpoint: str = request.getfixturevalue("dynalite_endpoint")
    return endpoint


@pytest.fixture
async def store(store_endpoint: str | None, tmp_path: Path) -> AsyncIterator[MessageStore]:
    made: MessageStore
    if store_endpoint is None:
        made = SQLiteMessageStore(tmp_path / "messages.db")
    else:
        dynamo = dynamodb_store(store_endpoint)
        await dynamo.create_table_if_missing()
        made = dynamo
    yield made
    await made.aclose()
