"""Builds the message store the settings ask for."""

from __future__ import annotations

from edge.config import MessagesConfig
from edge.dynamodb_client import dynamodb_client
from edge.messages.dynamodb import DynamoDBMessageStore
from edge.messages.sqlite import SQLiteMessageStore


async def create_store(config: MessagesConfig) -> SQLiteMessageStore | DynamoDBMessageStore:
    """Either store keeps the messages (MessageStore) and the conversations' locks (LockStore)."""
    ttl_s = round(config.ttl_days * 86400)
    if config.backend == "sqlite":
        return SQLiteMessageStore(config.sqlite_path, ttl_s=ttl_s)
    client = dynamodb_client(config.dynamodb_endpoint)
    store = DynamoDBMessageStore(client, config.dynamodb_table, ttl_s=ttl_s)
    if config.dynamodb_endpoint:
        # An endpoint override means a local DynamoDB-compatible server: nobody ran Terraform for it.
        await store.create_table_if_missing()
    return store
