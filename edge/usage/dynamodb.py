"""Usage rows in the keys table (iac/modules/keys_table): item (`usage#<user>`, `<day>#<model>`),
its counters added to atomically with UpdateItem ADD, so every edge writes without coordination."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anyio.to_thread

from edge.keys.dynamodb import PARTITION_KEY, SORT_KEY
from edge.usage.record import Usage

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
    def __init__(self, client: DynamoDBClient, table: str) -> None:
        self._client = client
        self._table = table

    async def add(self, usage: Usage) -> None:
        await anyio.to_thread.run_sync(self._add, usage)

    async def query(self, user: str | None = None, start: str = "", end: str = "") -> list[Usage]:
        rows = await anyio.to_thread.run_sync(self._query, user)
        return sorted(
            (r for r in rows if r.day >= start and (not end or r.day <= end)),
            key=lambda r: (r.user, r.day, r.model),
        )

    async def aclose(self) -> None:
        await anyio.to_thread.run_sync(self._client.close)

    def _add(self, u: Usage) -> None:
        self._client.update_item(
            TableName=self._table,
            Key={PARTITION_KEY: {"S": f"usage#{u.user}"}, SORT_KEY: {"S": f"{u.day}#{u.model}"}},
            UpdateExpression=(
                "SET #kind = :kind, #owner = :owner ADD input_tokens :i, output_tokens :o, requests :r"
            ),
            ExpressionAttributeNames={"#kind": "kind", "#owner": "owner"},
            ExpressionAttributeValues={
                ":kind": {"S": USAGE_ITEM},
                ":owner": {"S": u.user},
                ":i": {"N": str(u.input_tokens)},
                ":o": {"N": str(u.output_tokens)},
                ":r": {"N": str(u.requests)},
            },
        )

    def _query(self, user: str | None) -> list[Usage]:
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
