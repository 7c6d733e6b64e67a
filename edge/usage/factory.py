"""Builds the usage store beside the key store (same SQLite file, or the same DynamoDB table)."""

from __future__ import annotations

import anyio.to_thread

from edge.config import KeysConfig
from edge.dynamodb_client import dynamodb_client
from edge.keys.dynamodb import create_table_if_missing
from edge.usage.dynamodb import DynamoDBUsageStore
from edge.usage.sqlite import SQLiteUsageStore
from edge.usage.store import UsageStore


async def open_usage_store(config: KeysConfig, *, creates: bool) -> UsageStore:
    """`creates`: as open_key_store's (the usage rows live in the key table)."""
    if config.backend == "sqlite":
        return SQLiteUsageStore(config.sqlite_path)
    client = dynamodb_client(config.dynamodb_endpoint)
    if creates and config.dynamodb_endpoint:
        await anyio.to_thread.run_sync(create_table_if_missing, client, config.dynamodb_table)
    return DynamoDBUsageStore(client, config.dynamodb_table)
