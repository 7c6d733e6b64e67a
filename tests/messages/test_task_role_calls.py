"""The edge's task role on the messages table (iac/modules/edge_service/iam.tf) grants exactly the
calls the DynamoDB message store makes, read from the store itself against dynalite: a call the
role lacks fails in AWS alone (AccessDenied on every conversation request), a grant no call uses is
a door left open for nothing (DeleteItem on the lock partitions stayed after the locks' release
became a conditional UpdateItem)."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest

from edge.messages.dynamodb import PARTITION_KEY
from edge.messages.message import new_message
from tests.iac.hcl import MODULES, module
from tests.messages.conftest import dynamodb_store

pytestmark = pytest.mark.anyio


def granted(sid: str) -> set[str]:
    statements = module(MODULES / "edge_service").data("aws_iam_policy_document")["task"]["statement"]
    return {action for s in statements if s["sid"] == sid for action in s["actions"]}


async def test_the_task_role_grants_the_message_store_the_calls_it_makes(dynalite_endpoint: str) -> None:
    table = f"messages-{uuid.uuid4().hex[:8]}"
    store = dynamodb_store(dynalite_endpoint, table)
    await store.create_table_if_missing()
    client: Any = store._client
    calls: list[tuple[str, str]] = []

    def record(model: Any, params: dict[str, Any], **_: Any) -> None:
        key = params.get("Key") or params.get("Item") or {}
        partition = key.get(PARTITION_KEY, {}).get("S", "")
        calls.append((f"dynamodb:{model.name}", partition))

    client.meta.events.register("before-parameter-build.dynamodb.*", record)
    # Everything a conversation request does to the store: its lock taken, refused to another,
    # renewed, its turns stored, its history read, its lock given back (with and without a turn).
    conv, now = f"c_{uuid.uuid4().hex}", time.time()
    assert store.take_lock("alice", conv, "r_1", now, now + 20)
    assert not store.take_lock("alice", conv, "r_2", now, now + 20)
    assert store.renew_lock("alice", conv, "r_1", now + 40)
    turn = new_message(conv, "alice", "user", "hello", "r_1")
    await store.append(turn)
    assert (await store.history(conv, "alice")).messages == [turn]
    store.release_lock("alice", conv, "r_1", now + 1, turn.message_id)
    assert store.take_lock("alice", conv, "r_2", now, now + 20)
    store.release_lock("alice", conv, "r_2", now + 1, None)
    await store.aclose()

    messages, locks = granted("MessagesTable"), granted("MessagesTableLocks")
    assert {action for action, _ in calls} == messages | locks
    assert {action for action, partition in calls if partition.startswith("lock/")} == locks
