"""The production key store: the keys table (iac/modules/keys_table), partition key `pk`, sort key
`sk`. A key is the item (`key#<sha256>`, `key`), and its id is claimed by another (`key_id#<id>`,
`key_id`); usage records share the table (edge/usage/dynamodb.py).

Authentication reads one item by its hash (a strongly consistent GetItem), and finding a key by id
its id's claim, then the key. A page of keys (the admin API's and the CLI's listing) is one Query of
an index sorted by id: KEYS_BY_OWNER for one user's, KEYS_BY_KIND for everyone's. Both are sparse:
only key items carry both their attributes (a usage row has an owner but no id, an id's claim a kind
but no id). The whole consistent list (a rotation's chain), adding a key (an id no claim names may be
a key's stored before claims) and finding such a key scan the table: operator actions, rare next to
lookups."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anyio.to_thread

from edge.dynamodb_client import MAX_PARTITION_KEY_BYTES
from edge.dynamodb_table import make_table_if_missing
from edge.keys.page import KeyPage, page_of
from edge.keys.record import KeyRecord

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_dynamodb.type_defs import (
        AttributeDefinitionTypeDef,
        AttributeValueTypeDef,
        GlobalSecondaryIndexTypeDef,
        PutItemInputTypeDef,
        QueryInputTypeDef,
        ScanInputTypeDef,
    )

PARTITION_KEY = "pk"
SORT_KEY = "sk"
KEY_ITEM = "key"
# A key id's claim (`key_id#<id>`, `key_id`): ids are 48 bits of the hash, and two keys' can agree.
ID_ITEM = "key_id"
# The indexes a page of keys is read from (iac/modules/keys_table declares them too): partition
# key the user (`owner`), or the item's kind (`key`, for everyone's), sort key the key's id.
KEYS_BY_OWNER = "keys_by_owner"
KEYS_BY_KIND = "keys_by_kind"
_INDEXES = {KEYS_BY_OWNER: "owner", KEYS_BY_KIND: "kind"}


def key_pk(key_sha256: str) -> str:
    return f"key#{key_sha256}"


def id_pk(key_id: str) -> str:
    return f"key_id#{key_id}"


def _key(key_sha256: str) -> dict[str, AttributeValueTypeDef]:
    return {PARTITION_KEY: {"S": key_pk(key_sha256)}, SORT_KEY: {"S": KEY_ITEM}}


def _item(r: KeyRecord) -> dict[str, AttributeValueTypeDef]:
    item: dict[str, AttributeValueTypeDef] = {
        PARTITION_KEY: {"S": key_pk(r.key_sha256)},
        SORT_KEY: {"S": KEY_ITEM},
        "kind": {"S": KEY_ITEM},
        "id": {"S": r.id},
        "key_sha256": {"S": r.key_sha256},
        "owner": {"S": r.user},
        "tier": {"S": r.tier},
        "label": {"S": r.label},
        "created": {"N": repr(r.created)},
        "last4": {"S": r.last4},
    }
    if r.expires is not None:
        item["expires"] = {"N": repr(r.expires)}
    if r.revoked is not None:
        item["revoked"] = {"N": repr(r.revoked)}
    if r.replaced_by is not None:
        item["replaced_by"] = {"S": r.replaced_by}
    if r.replaces is not None:
        item["replaces"] = {"S": r.replaces}
    return item


def _record(item: dict[str, Any]) -> KeyRecord:
    def number(name: str) -> float | None:
        return float(item[name]["N"]) if name in item else None

    return KeyRecord(
        id=item["id"]["S"],
        key_sha256=item["key_sha256"]["S"],
        user=item["owner"]["S"],
        tier=item["tier"]["S"],
        label=item["label"]["S"],
        created=float(item["created"]["N"]),
        expires=number("expires"),
        revoked=number("revoked"),
        last4=item["last4"]["S"],
        replaced_by=item["replaced_by"]["S"] if "replaced_by" in item else None,
        replaces=item["replaces"]["S"] if "replaces" in item else None,
    )


class DynamoDBKeyStore:
    """boto3 clients are thread-safe: every call runs in a worker thread on the shared client."""

    def __init__(self, client: DynamoDBClient, table: str) -> None:
        self._client = client
        self._table = table

    async def get(self, key_sha256: str) -> KeyRecord | None:
        return await anyio.to_thread.run_sync(self._get, key_sha256)

    async def add(self, record: KeyRecord) -> bool:
        return await anyio.to_thread.run_sync(self._add, record)

    async def put(self, record: KeyRecord) -> None:
        await anyio.to_thread.run_sync(self._put, record)

    async def retire(self, key_sha256: str, replaced_by: str, expires: float) -> KeyRecord | None:
        return await anyio.to_thread.run_sync(self._retire, key_sha256, replaced_by, expires)

    async def by_id(self, key_id: str) -> KeyRecord | None:
        return await anyio.to_thread.run_sync(self._by_id, key_id)

    async def list_keys(self, user: str | None = None) -> list[KeyRecord]:
        found = await anyio.to_thread.run_sync(self._scan, "owner", user, None)
        return sorted(found, key=lambda r: (r.created, r.id))

    async def page_keys(self, user: str | None, after: str | None, limit: int) -> KeyPage:
        return page_of(await anyio.to_thread.run_sync(self._page, user, after, limit + 1), limit)

    async def any_usable(self, now: float) -> bool:
        return bool(await anyio.to_thread.run_sync(self._scan, None, None, 1, now))

    async def create_table_if_missing(self) -> None:
        """For a local DynamoDB-compatible endpoint; in AWS the table comes from Terraform."""
        await anyio.to_thread.run_sync(create_table_if_missing, self._client, self._table)

    async def aclose(self) -> None:
        await anyio.to_thread.run_sync(self._client.close)

    def _get(self, key_sha256: str) -> KeyRecord | None:
        found = self._client.get_item(TableName=self._table, Key=_key(key_sha256), ConsistentRead=True)
        item = found.get("Item")
        return _record(item) if item else None

    def _by_id(self, key_id: str) -> KeyRecord | None:
        # The id's claim names the key: two reads. Before, every revoke, rotate and set-tier scanned
        # the whole table, usage records and all. Scanned for still: an id no claim names (a key an
        # edge before claims stored), or a claim whose key was never written (its add failed).
        if len(id_pk(key_id).encode()) > MAX_PARTITION_KEY_BYTES:
            # No claim can have it, and no key either (ids are at most 64 hex digits): read, it was
            # a ValidationException, a 500 for an admin URL naming such an id.
            return None
        found = self._client.get_item(
            TableName=self._table,
            Key={PARTITION_KEY: {"S": id_pk(key_id)}, SORT_KEY: {"S": ID_ITEM}},
            ConsistentRead=True,
        )
        claim = found.get("Item")
        if claim is not None:
            record = self._get(claim["key_sha256"]["S"])
            if record is not None and record.id == key_id:
                return record
        scanned = self._scan("id", key_id, 1)
        return scanned[0] if scanned else None

    def _put(self, record: KeyRecord) -> None:
        # A revocation is final (KeyStore.put): a record without one is written only over a stored
        # record without one; else the stored revocation stands, and so does the rest of it (a
        # tier or an expiry for a revoked key changes nothing anyone can use). A replacement is
        # final too: a record without the stored one (read before the rotation) is written with
        # the stored replacement and expiry. Before, it was not written at all: a tier change that
        # had read the key before a rotation was lost on the old key, which went on at the old tier.
        if record.revoked is not None:
            self._client.put_item(TableName=self._table, Item=_item(record))
            return
        # Twice at most: a replacement, once stored, stays.
        for _ in range(2):
            params: PutItemInputTypeDef = {
                "TableName": self._table,
                "Item": _item(record),
                "ConditionExpression": "attribute_not_exists(revoked) AND attribute_not_exists(replaced_by)",
            }
            if record.replaced_by is not None:
                params["ConditionExpression"] = (
                    "attribute_not_exists(revoked) AND "
                    "(attribute_not_exists(replaced_by) OR replaced_by = :replaced_by)"
                )
                params["ExpressionAttributeValues"] = {":replaced_by": {"S": record.replaced_by}}
            try:
                self._client.put_item(**params)
                return
            except self._client.exceptions.ConditionalCheckFailedException:
                stored = self._get(record.key_sha256)
            if stored is None or stored.revoked is not None or stored.replaced_by is None:
                return
            record = record.with_changes(replaced_by=stored.replaced_by, expires=stored.expires)

    def _add(self, record: KeyRecord) -> bool:
        # A key stored already: one strongly consistent read (every start imports keys_file again).
        if self._get(record.key_sha256) is not None:
            return False
        # The id is no key of the table, so no condition on the key's item can refuse it: the id is
        # claimed by an item of its own, first. Keys stored before claims were made have none, and
        # are looked for.
        if self._scan("id", record.id, 1):
            return False
        try:
            self._client.put_item(
                TableName=self._table,
                Item={
                    PARTITION_KEY: {"S": id_pk(record.id)},
                    SORT_KEY: {"S": ID_ITEM},
                    "kind": {"S": ID_ITEM},
                    "key_sha256": {"S": record.key_sha256},
                },
                # Claimed by this key before (an add that got no further): still its own.
                ConditionExpression=f"attribute_not_exists({PARTITION_KEY}) OR key_sha256 = :key",
                ExpressionAttributeValues={":key": {"S": record.key_sha256}},
            )
            self._client.put_item(
                TableName=self._table,
                Item=_item(record),
                ConditionExpression=f"attribute_not_exists({PARTITION_KEY})",
            )
        except self._client.exceptions.ConditionalCheckFailedException:
            return False
        return True

    def _retire(self, key_sha256: str, replaced_by: str, expires: float) -> KeyRecord | None:
        try:
            self._client.update_item(
                TableName=self._table,
                Key=_key(key_sha256),
                UpdateExpression="SET #expires = :expires, #replaced_by = :replaced_by",
                # Not over a revocation either (KeyStore.retire): the rotation revokes its new key.
                ConditionExpression=f"attribute_exists({PARTITION_KEY}) "
                "AND attribute_not_exists(#replaced_by) AND attribute_not_exists(revoked)",
                ExpressionAttributeNames={"#expires": "expires", "#replaced_by": "replaced_by"},
                ExpressionAttributeValues={
                    ":expires": {"N": repr(expires)},
                    ":replaced_by": {"S": replaced_by},
                },
            )
        except self._client.exceptions.ConditionalCheckFailedException:
            pass  # replaced or revoked already (or no such key): the stored record says which
        return self._get(key_sha256)

    def _page(self, user: str | None, after: str | None, want: int) -> list[KeyRecord]:
        """Up to `want` keys past `after` in id order, off the index. The cursor is a condition on
        the index's sort key (`id > :after`), which is what an ExclusiveStartKey built from it would
        be, with no read of the cursor's key to learn its table key (its hash) first."""
        if user is not None and (not user.strip() or len(user.encode()) > MAX_PARTITION_KEY_BYTES):
            return []  # no key has such a user (records refuse it), and the Query would be refused
        index = KEYS_BY_OWNER if user is not None else KEYS_BY_KIND
        condition = "#p = :p"
        names = {"#p": _INDEXES[index]}
        values: dict[str, AttributeValueTypeDef] = {":p": {"S": user if user is not None else KEY_ITEM}}
        if after is not None:
            condition += " AND #id > :after"
            names["#id"] = "id"
            values[":after"] = {"S": after}
        found: list[KeyRecord] = []
        start: dict[str, Any] | None = None
        while True:
            params: QueryInputTypeDef = {
                "TableName": self._table,
                "IndexName": index,
                "KeyConditionExpression": condition,
                "ExpressionAttributeNames": names,
                "ExpressionAttributeValues": values,
                "Limit": want - len(found),
            }
            if start:
                params["ExclusiveStartKey"] = start
            page = self._client.query(**params)
            found.extend(_record(item) for item in page.get("Items", []))
            # Again only where a page stopped at DynamoDB's 1 MB before `want` items.
            start = page.get("LastEvaluatedKey")
            if not start or len(found) >= want:
                return found

    def _scan(
        self, attribute: str | None, value: str | None, want: int | None, usable_at: float | None = None
    ) -> list[KeyRecord]:
        """Key items (whose `attribute` equals `value`, when given; that work at `usable_at`, when
        given); stops after `want` of them."""
        names: dict[str, str] = {"#kind": "kind"}
        values: dict[str, AttributeValueTypeDef] = {":kind": {"S": KEY_ITEM}}
        condition = "#kind = :kind"
        if attribute is not None and value is not None:
            names["#a"] = attribute
            values[":v"] = {"S": value}
            condition += " AND #a = :v"
        if usable_at is not None:
            names["#revoked"] = "revoked"
            names["#expires"] = "expires"
            values[":now"] = {"N": repr(usable_at)}
            condition += (
                " AND attribute_not_exists(#revoked) AND (attribute_not_exists(#expires) OR #expires > :now)"
            )
        found: list[KeyRecord] = []
        start: dict[str, Any] | None = None
        while True:
            params: ScanInputTypeDef = {
                "TableName": self._table,
                "FilterExpression": condition,
                "ExpressionAttributeNames": names,
                "ExpressionAttributeValues": values,
                "ConsistentRead": True,
            }
            if start:
                params["ExclusiveStartKey"] = start
            page = self._client.scan(**params)
            found.extend(_record(item) for item in page.get("Items", []))
            start = page.get("LastEvaluatedKey")
            if not start or (want is not None and len(found) >= want):
                return found


_ATTRIBUTES: list[AttributeDefinitionTypeDef] = [
    {"AttributeName": name, "AttributeType": "S"} for name in (PARTITION_KEY, SORT_KEY, "owner", "kind", "id")
]


def _index(name: str) -> GlobalSecondaryIndexTypeDef:
    return {
        "IndexName": name,
        "KeySchema": [
            {"AttributeName": _INDEXES[name], "KeyType": "HASH"},
            {"AttributeName": "id", "KeyType": "RANGE"},
        ],
        "Projection": {"ProjectionType": "ALL"},
    }


def create_table_if_missing(client: DynamoDBClient, table: str) -> None:
    """A local table made before the listing's indexes is not given them here (dynalite never
    makes an index added to a table ACTIVE): make it again. In AWS, Terraform adds them, and
    DynamoDB builds them from the items stored."""
    make_table_if_missing(
        client,
        table,
        lambda: client.create_table(
            TableName=table,
            AttributeDefinitions=_ATTRIBUTES,
            GlobalSecondaryIndexes=[_index(name) for name in _INDEXES],
            KeySchema=[
                {"AttributeName": PARTITION_KEY, "KeyType": "HASH"},
                {"AttributeName": SORT_KEY, "KeyType": "RANGE"},
            ],
            BillingMode="PAY_PER_REQUEST",
        ),
    )
