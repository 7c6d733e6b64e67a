"""Key and usage stores for the tests: every store test runs on SQLite and on DynamoDB (dynalite)."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from pathlib import Path

import boto3
import pytest

from edge.keys import record as record_module
from edge.keys.dynamodb import DynamoDBKeyStore, create_table_if_missing
from edge.keys.sqlite import SQLiteKeyStore
from edge.keys.store import KeyStore
from edge.usage.dynamodb import DynamoDBUsageStore
from edge.usage.sqlite import SQLiteUsageStore
from edge.usage.store import UsageStore
from tests.messages.conftest import dynalite_endpoint  # noqa: F401  (the session's dynalite)

# Two real keys whose ids agree: the first 48 bits of their hashes do (found by hashing 4e7 such
# names). A fresh key's id is a stored key's about once in 2**48 / (keys stored) keys.
SAME_ID = ("fg-collide-10708684", "fg-collide-35722450")


def next_secrets(monkeypatch: pytest.MonkeyPatch, *keys: str | None) -> None:
    """The keys the next creations and rotations in this process make, in order (None: a random
    one, as ever); random ones after these."""
    queue = list(keys)
    random_secret = record_module.new_secret

    def secret(prefix: str = record_module.KEY_PREFIX) -> str:
        given = queue.pop(0) if queue else None
        return given if given is not None else random_secret(prefix)

    monkeypatch.setattr(record_module, "new_secret", secret)


def dynamodb_client(endpoint: str) -> object:
    return boto3.client(
        "dynamodb",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="test",
        aws_secret_access_key="test",
    )


@pytest.fixture(params=["sqlite", "dynamodb"])
def backend(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> dict[str, str]:
    """The [keys] settings of a fresh store: a SQLite file, or a new table on dynalite (which takes
    any credentials; the edge's boto3 client finds these in the environment, as in a task)."""
    if request.param == "sqlite":
        return {"backend": "sqlite", "sqlite_path": str(tmp_path / "keys.db")}
    endpoint: str = request.getfixturevalue("dynalite_endpoint")
    for name, value in (
        ("AWS_ACCESS_KEY_ID", "test"),
        ("AWS_SECRET_ACCESS_KEY", "test"),
        ("AWS_DEFAULT_REGION", "us-east-1"),
    ):
        monkeypatch.setenv(name, value)
    return {
        "backend": "dynamodb",
        "dynamodb_endpoint": endpoint,
        "dynamodb_table": f"keys-{secrets.token_hex(4)}",
    }


@pytest.fixture
async def key_store(backend: dict[str, str]) -> AsyncIterator[KeyStore]:
    store: KeyStore
    if backend["backend"] == "sqlite":
        store = SQLiteKeyStore(backend["sqlite_path"])
    else:
        client = dynamodb_client(backend["dynamodb_endpoint"])
        create_table_if_missing(client, backend["dynamodb_table"])  # type: ignore[arg-type]
        store = DynamoDBKeyStore(client, backend["dynamodb_table"])  # type: ignore[arg-type]
    yield store
    await store.aclose()


@pytest.fixture
async def usage_store(backend: dict[str, str]) -> AsyncIterator[UsageStore]:
    store: UsageStore
    if backend["backend"] == "sqlite":
        store = SQLiteUsageStore(backend["sqlite_path"])
    else:
        client = dynamodb_client(backend["dynamodb_endpoint"])
        create_table_if_missing(client, backend["dynamodb_table"])  # type: ignore[arg-type]
        store = DynamoDBUsageStore(client, backend["dynamodb_table"])  # type: ignore[arg-type]
    yield store
    await store.aclose()
