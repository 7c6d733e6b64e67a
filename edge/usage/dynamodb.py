"""Usage rows in the keys table (iac/modules/keys_table): item (`usage#<user>`, `<day>#<model>`),
its counters added to atomically with UpdateItem ADD, so every edge writes without coordination.

ADD is not idempotent, and an UpdateItem can land with its answer lost; boto3 then sends it again
(up to ten times by default) and so does the writer: each lost answer billed the row twice. So the
update also sets the item's `write#<writer>` attribute to the write's seq, on the condition that
the attribute is missing or below it (edge/usage/store.py: WriteId); a repeated write fails that
condition and adds nothing. An item keeps one such attribute per edge process that wrote to it
that day (~30 bytes each).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anyio.to_thread
from botocore.exceptions import ClientError

from edge.dynamodb_client import MAX_PARTITION_KEY_BYTES
from edge.keys.dynamodb import PARTITION_KEY, SORT_KEY
from edge.usage.record import Usage
from edge.usage.store import UsageRefused, WriteId

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_dynamodb.type_defs import AttributeValueTypeDef

USAGE_ITEM = "usage"


def _usage(item: dict[str, Any]) -> Usage:
    day, _, model = item[SORT_KEY]["S"].partition("#")
    return Usage(
        user=item["owner"]["S"],
        model=model,
        day=day,
        input_tokens=int(item["input_tokens"]["N"]),
        output_tokens=int(item["output_tokens"]["N"]),
        requests=int(item["requests"]["N"]),
    )


class DynamoDBUsageStore:
    # Each item keeps its own writer's seq (module doc), so rows of distinct items may go at once,
    # within boto3's connection pool (10 by default), leaving room for the keys' and messages' calls.
    parallel_writes = 4

    def __init__(self, client: DynamoDBClient, table: str) -> None:
        self._client = client
        self._table = table

    async def add(self, usage: Usage, write: WriteId) -> bool:
        return await anyio.to_thread.run_sync(self._add, usage, write)

    async def query(self, user: str | None = None, start: str = "", end: str = "") -> list[Usage]:
        rows = await anyio.to_thread.run_sync(self._query, user)
        return sorted(
            (r for r in rows if r.day >= start and (not end or r.day <= end)),
            key=lambda r: (r.user, r.day, r.model),
        )

    async def aclose(self) -> None:
        await anyio.to_thread.run_sync(self._client.close)

    def _add(self, u: Usage, write: WriteId) -> bool:
        try:
            self._client.update_item(
                TableName=self._table,
                Key={PARTITION_KEY: {"S": f"usage#{u.user}"}, SORT_KEY: {"S": f"{u.day}#{u.model}"}},
                UpdateExpression=(
                    "SET #kind = :kind, #owner = :owner, #write = :seq "
                    "ADD input_tokens :i, output_tokens :o, requests :r"
                ),
                ConditionExpression="attribute_not_exists(#write) OR #write < :seq",
                ExpressionAttributeNames={
                    "#kind": "kind",
                    "#owner": "owner",
                    "#write": f"write#{write.writer}",
                },
                ExpressionAttributeValues={
                    ":kind": {"S": USAGE_ITEM},
                    ":owner": {"S": u.user},
                    ":seq": {"N": str(write.seq)},
                    ":i": {"N": str(u.input_tokens)},
                    ":o": {"N": str(u.output_tokens)},
                    ":r": {"N": str(u.requests)},
                },
            )
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code")
            if code == "ConditionalCheckFailedException":
                return False
            if code == "ValidationException":
                # The item itself is refused (a user name too long for the partition key): no
                # retry can write it.
                raise UsageRefused(str(exc)) from exc
            raise
        return True

    def _query(self, user: str | None) -> list[Usage]:
        if user is not None and len(f"usage#{user}".encode()) > MAX_PARTITION_KEY_BYTES:
            # No row of such a name can be stored (_add: UsageRefused), and asked for, the Query was
            # a ValidationException: a 503 store_unavailable for good for a user named before names
            # were bounded (edge/keys/lifecycle.py), or imported from a keys file.
            return []
        found: list[Usage] = []
        start: dict[str, Any] | None = None
        while True:
            values: dict[str, AttributeValueTypeDef]
            if user is not None:
                values = {":pk": {"S": f"usage#{user}"}}
                params: dict[str, Any] = {
                    "KeyConditionExpression": f"{PARTITION_KEY} = :pk",
                    "ExpressionAttributeValues": values,
                }
            else:
                values = {":kind": {"S": USAGE_ITEM}}
                params = {
                    "FilterExpression": "#kind = :kind",
                    "ExpressionAttributeNames": {"#kind": "kind"},
                    "ExpressionAttributeValues": values,
                }
            params |= {"TableName": self._table, "ConsistentRead": True}
            if start:
                params["ExclusiveStartKey"] = start
            page = self._client.query(**params) if user is not None else self._client.scan(**params)
            found.extend(_usage(item) for item in page.get("Items", []))
            start = page.get("LastEvaluatedKey")
            if not start:
                return found
