"""Builds the key store the settings ask for, and the announcer of key changes."""

from __future__ import annotations

from edge.config import KeysConfig, LimiterConfig
from edge.dynamodb_client import dynamodb_client
from edge.keys.changes import RedisKeyChanges
from edge.keys.dynamodb import DynamoDBKeyStore
from edge.keys.sqlite import SQLiteKeyStore
from edge.keys.store import KeyStore


async def open_key_store(config: KeysConfig, *, creates: bool) -> KeyStore:
    """`creates`: whether a missing store may be made (the edge, a command that adds keys). A read
    alone (`keys list`, `usage`) made the table at a local endpoint and answered "no keys" from it,
    as a mistyped SQLite path did (edge/keys_cli.py): it now meets no table, and says so."""
    if config.backend == "sqlite":
        return SQLiteKeyStore(config.sqlite_path)
    client = dynamodb_client(config.dynamodb_endpoint)
    store = DynamoDBKeyStore(client, config.dynamodb_table)
    if creates and config.dynamodb_endpoint:
        # An endpoint override means a local DynamoDB-compatible server: nobody ran Terraform for it.
        await store.create_table_if_missing()
    return store


def key_changes(limiter: LimiterConfig) -> RedisKeyChanges | None:
    """Pub/sub over the limiter's Redis when it has one; None: the cache TTL alone is the bound."""
    if limiter.backend != "redis":
        return None
    return RedisKeyChanges(limiter.redis_url, timeout_ms=limiter.timeout_ms, cluster=limiter.redis_cluster)
