"""create_store builds the configured backend, ready to use."""

from __future__ import annotations

from pathlib import Path

import boto3
import pytest

from edge.config import load_settings
from edge.messages.dynamodb import DynamoDBMessageStore, owned_partition
from edge.messages.factory import create_store
from edge.messages.message import new_message
from edge.messages.sqlite import SQLiteMessageStore

pytestmark = pytest.mark.anyio


async def test_sqlite_is_the_embedded_default(tmp_path: Path) -> None:
    path = tmp_path / "nested" / "messages.db"
    settings = load_settings(overrides={"messages": {"sqlite_path": str(path)}})

    store = await create_store(settings.messages)
    msg = new_message("c1", "alice", "user", "hi", "r_1")
    await store.append(msg)

    assert isinstance(store, SQLiteMessageStore)
    assert (await store.history("c1", "alice")).messages == [msg]
    assert path.exists()
    await store.aclose()


async def test_dynamodb_with_a_local_endpoint_creates_its_table(
    dynalite_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    settings = load_settings(
        overrides={
            "messages": {
                "backend": "dynamodb",
                "dynamodb_table": "floodgate-factory-test",
                "dynamodb_endpoint": dynalite_endpoint,
                "ttl_days": 2,
            }
        }
    )

    store = await create_store(settings.messages)
    msg = new_message("c1", "alice", "user", "hi", "r_1")
    await store.append(msg)

    assert isinstance(store, DynamoDBMessageStore)
    assert (await store.history("c1", "alice")).messages == [msg]
    await store.aclose()
    raw = boto3.client("dynamodb", endpoint_url=dynalite_endpoint)
    item = raw.get_item(
        TableName="floodgate-factory-test",
        Key={"conversation_id": {"S": owned_partition("alice", "c1")}, "message_id": {"S": msg.message_id}},
    )["Item"]
    assert int(item["expires_at"]["N"]) == int(msg.created_at) + 2 * 86400
