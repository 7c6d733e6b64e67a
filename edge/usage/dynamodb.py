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

from edge.dynamodb_client import MAX_PARTITION_KEY_BYTES, MAX_SORT_KEY_BYTES
from edge.keys.dynamodb import PARTITION_KEY, SORT_KEY
from edge.usage.page import BadCursor, Position, UsagePage, page_of
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
        # An item no edge has added a cached count to since the count began has none: 0.
        input_cached_tokens=int(item.get("input_cached_tokens", {"N": "0"})["N"]),
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

    async def page(
        self, user: str | None, start: str, end: str, after: Position | None, limit: int
    ) -> UsagePage:
        found = await anyio.to_thread.run_sync(self._page, user, start, end, after, limit + 1)
        return page_of(found, limit)

    async def aclose(self) -> None:
        await anyio.to_thread.run_sync(self._client.close)

    def _add(self, u: Usage, write: WriteId) -> bool:
        try:
            self._client.update_item(
                TableName=self._table,
                Key={PARTITION_KEY: {"S": f"usage#{u.user}"}, SORT_KEY: {"S": f"{u.day}#{u.model}"}},
                UpdateExpression=(
                    "SET #kind = :kind, #owner = :owner, #write = :seq "
                    "ADD input_tokens :i, output_tokens :o, requests :r, input_cached_tokens :c"
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
                    ":c": {"N": str(u.input_cached_tokens)},
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

    def _page(self, user: str | None, start: str, end: str, after: Position | None, want: int) -> list[Usage]:
        """One user's: a Query of their partition, the days a condition on the sort key
        (`<day>#<model>`: `<end>$` sorts past every model of the end day). Everyone's: a Scan, a
        page of it, in its own order. Either starts at the cursor's row's own table key."""
        if user is not None and len(f"usage#{user}".encode()) > MAX_PARTITION_KEY_BYTES:
            return []  # as _query: no such row can be stored
        if after is not None and user is not None and after[0] != user:
            # A cursor of another user's row: in (user, day, model) order, as SQLite's keyset reads,
            # every row of this user follows one of a user sorting before, none one sorting after.
            # An empty page for both said a user whose name sorts after the cursor's used nothing.
            if after[0] > user:
                return []
            after = None
        if start and end and start > end:
            # No day is in the range, as SQLite answers; a Query's BETWEEN with its bounds the wrong
            # way round is a ValidationException, a 503 that no retry mends (and a Scan, all read).
            return []
        names: dict[str, str] = {}
        values: dict[str, AttributeValueTypeDef] = {}
        days: list[str] = []
        if start:
            days.append("#sk >= :start" if user is not None else "#day >= :start")
            values[":start"] = {"S": start}
        if end:
            days.append("#sk <= :end" if user is not None else "#day <= :end")
            values[":end"] = {"S": f"{end}$"}
        params: dict[str, Any] = {"TableName": self._table, "ConsistentRead": True}
        if user is not None:
            names["#pk"] = PARTITION_KEY
            values[":pk"] = {"S": f"usage#{user}"}
            sk = ""
            if start and end:
                sk, days = " AND #sk BETWEEN :start AND :end", []
            elif days:
                sk, days = f" AND {days[0]}", []
            if sk:
                names["#sk"] = SORT_KEY
            params["KeyConditionExpression"] = f"#pk = :pk{sk}"
        else:
            names["#kind"] = "kind"
            values[":kind"] = {"S": USAGE_ITEM}
            if days:
                names["#day"] = SORT_KEY
            params["FilterExpression"] = " AND ".join(["#kind = :kind", *days])
        params["ExpressionAttributeNames"] = names
        params["ExpressionAttributeValues"] = values
        key: dict[str, Any] | None = None
        if after is not None:
            after_sk = f"{after[1]}#{after[2]}"
            if (
                len(f"usage#{after[0]}".encode()) > MAX_PARTITION_KEY_BYTES
                or len(after_sk.encode()) > MAX_SORT_KEY_BYTES
            ):
                # No row has such a key (_add: UsageRefused), and as ExclusiveStartKey it is a
                # ValidationException: a 503 that retrying never mends.
                raise BadCursor("no usage row has this key")
            # A Query refuses a start key outside its sort-key condition (a ValidationException): a
            # cursor of a wider range, or of any range, asked for with this one. Every row of the
            # range follows a cursor before it, and none one past it.
            if user is not None and end and after_sk > f"{end}$":
                return []
            if user is None or not start or after_sk >= start:
                key = {PARTITION_KEY: {"S": f"usage#{after[0]}"}, SORT_KEY: {"S": after_sk}}
        found: list[Usage] = []
        while True:
            call = dict(params, Limit=want - len(found) if user is not None else max(want, 100))
            if key:
                call["ExclusiveStartKey"] = key
            page = self._client.query(**call) if user is not None else self._client.scan(**call)
            for item in page.get("Items", []):
                found.append(_usage(item))
                if len(found) >= want:
                    return found
            key = page.get("LastEvaluatedKey")
            if not key:
                return found

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
