"""The production message store: one DynamoDB table, partition key `conversation_id`, sort key
`message_id`. Rows carry their `owner`, checked on every read, and an `expires_at` TTL attribute.

The partition is the owner's conversation (`owned_partition`: the owner and the id the client chose,
which `conversation` keeps). Keyed by the client's id alone, every user who chose the same id
("default", "chat") shared one partition: a history read paged through all their messages, the
owner filter dropping the others' after DynamoDB had read and billed them, and another user's id
answered its 404 as late as that partition was long (1,130 ms against 56 for a missing id, with
4,000 messages in it: a timing oracle, and reads an attacker could make others pay for). Messages
written before are still read where they are (`LEGACY_PARTITIONS`) until their TTL has taken them.

A DynamoDB item holds at most 400 KB, and a request body may be 1 MiB: a message whose text does
not fit is kept compressed (`content_z`, zlib), and one that does not fit even so is kept cut to
what fits, marked `truncated` (SQLite keeps every message whole).

A conversation's lock (edge/messages/conversation_lock.py) is an item of the same table, in a
partition of its own (`lock_partition`): taken with a conditional UpdateItem that reads back what
the last holder left in it (`last_message_id`), renewed and given back only by the request it names
(conditional UpdateItems: given back, it loses its holder and keeps the conversation's newest
message id); its end is the table's TTL attribute, so a lock an edge died holding, or released, is
deleted by DynamoDB too."""

from __future__ import annotations

import heapq
import math
import time
import zlib
from typing import TYPE_CHECKING, Any

import anyio.to_thread
from botocore.exceptions import ClientError

from edge.dynamodb_client import MAX_PARTITION_KEY_BYTES
from edge.dynamodb_table import make_table_if_missing
from edge.messages.conversation_lock import Taken
from edge.messages.message import StoredMessage
from edge.messages.store import DEFAULT_TTL_S, HistoryPage, MessageRefused, Order, Span, full, reads, span

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_dynamodb.type_defs import AttributeValueTypeDef, QueryInputTypeDef

PARTITION_KEY = "conversation_id"
SORT_KEY = "message_id"
TTL_ATTRIBUTE = "expires_at"  # iac/modules/messages_table enables TTL on it
CONVERSATION = "conversation"  # the client's conversation id (the partition also names its owner)
# Messages written before partitions named their owner are read from the client's id too, for the
# [messages] ttl_days after the release that changed it (90 by default); then this goes.
LEGACY_PARTITIONS = True
# One Query page: enough to fill a typical history in one round trip even when the owner filter
# (applied after the page is read) discards some rows.
_PAGE = 200
# Of an item's 400 KB (names and values), what its content may take: the other attributes are
# a few ids (a conversation id is at most 256 characters), a number or two and their names.
CONTENT_BYTES = 390_000
# The sort key of a lock's item: no message id (26 upper-case Crockford characters) spells it.
LOCK_SORT_KEY = "lock"
# What a released lock keeps for the next take (edge/messages/conversation_lock.py).
LAST_MESSAGE_ID = "last_message_id"
_CONDITION_FAILED = "ConditionalCheckFailedException"
# Errors no retry can mend: the item itself is refused.
_REFUSALS = frozenset({"ValidationException", "ItemCollectionSizeLimitExceededException"})


def _content(text: str) -> dict[str, AttributeValueTypeDef]:
    raw = text.encode()
    if len(raw) <= CONTENT_BYTES:
        return {"content": {"S": text}}
    packed = zlib.compress(raw, 6)
    if len(packed) <= CONTENT_BYTES:
        return {"content_z": {"B": packed}}
    # Even compressed it does not fit: as much of its start as does, cut on a character's edge.
    return {"content": {"S": raw[:CONTENT_BYTES].decode(errors="ignore")}, "truncated": {"BOOL": True}}


def owned_partition(user: str, conversation_id: str) -> str:
    """The partition of `user`'s conversation: the owner's length first, so no user and id
    together spell another pair's (user "a:b" with id "c" against user "a" with id "b:c"), and a
    "/", which no conversation id holds (schemas.ConversationId; the route's path segment cannot),
    so no client's id names one as a legacy partition: "5:alice:trip" did, and read alice's "trip"
    (its items scanned, its 404 late again; alice's own id of that name answered with "trip")."""
    return f"{len(user)}/{user}/{conversation_id}"


def lock_partition(user: str, conversation_id: str) -> str:
    """The partition of the lock of `user`'s conversation: beginning "lock/", it is neither an owned
    partition (those begin with a number) nor a legacy one (no conversation id holds a "/"), so no
    history read ever reads it."""
    return f"lock/{owned_partition(user, conversation_id)}"


def _lock_key(user: str, conversation_id: str) -> dict[str, AttributeValueTypeDef]:
    return {
        PARTITION_KEY: {"S": lock_partition(user, conversation_id)},
        SORT_KEY: {"S": LOCK_SORT_KEY},
    }


def _ttl_seconds(expires_at: float) -> str:
    """A lock's end as its TTL attribute: whole epoch seconds, as DynamoDB's TTL reads it (the
    messages' own are whole too), rounded up: a second longer at most, never shorter."""
    return str(math.ceil(expires_at))


def _condition_failed(exc: ClientError) -> bool:
    return exc.response.get("Error", {}).get("Code") == _CONDITION_FAILED


def _item(msg: StoredMessage, expires_at: int) -> dict[str, AttributeValueTypeDef]:
    item: dict[str, AttributeValueTypeDef] = {
        PARTITION_KEY: {"S": owned_partition(msg.user, msg.conversation_id)},
        CONVERSATION: {"S": msg.conversation_id},
        SORT_KEY: {"S": msg.message_id},
        "owner": {"S": msg.user},
        "role": {"S": msg.role},
        **_content(msg.content),
        "request_id": {"S": msg.request_id},
        "created_at": {"N": repr(msg.created_at)},
        TTL_ATTRIBUTE: {"N": str(expires_at)},
    }
    if msg.finish_reason is not None:
        item["finish_reason"] = {"S": msg.finish_reason}
    if msg.name is not None:
        item["name"] = {"S": msg.name}
    if msg.model is not None:
        item["model"] = {"S": msg.model}
    return item


def _message(item: dict[str, Any]) -> StoredMessage:
    finish = item.get("finish_reason")
    name = item.get("name")
    # An item written before replies kept their model has none: read as None, as SQLite's rows are.
    model = item.get("model")
    packed = item.get("content_z")
    conversation = item.get(CONVERSATION) or item[PARTITION_KEY]  # a legacy item: its id was the key
    return StoredMessage(
        conversation_id=conversation["S"],
        user=item["owner"]["S"],
        message_id=item[SORT_KEY]["S"],
        role=item["role"]["S"],
        content=zlib.decompress(packed["B"]).decode() if packed else item["content"]["S"],
        request_id=item["request_id"]["S"],
        created_at=float(item["created_at"]["N"]),
        finish_reason=finish["S"] if finish else None,
        truncated="truncated" in item,
        name=name["S"] if name else None,
        model=model["S"] if model else None,
    )


class DynamoDBMessageStore:
    """boto3 clients are thread-safe: every call runs in a worker thread on the shared client."""

    def __init__(self, client: DynamoDBClient, table: str, *, ttl_s: int = DEFAULT_TTL_S) -> None:
        self._client = client
        self._table = table
        self._ttl_s = ttl_s

    async def append(self, msg: StoredMessage) -> None:
        item = _item(msg, int(msg.created_at) + self._ttl_s)
        try:
            await anyio.to_thread.run_sync(lambda: self._client.put_item(TableName=self._table, Item=item))
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in _REFUSALS:
                raise MessageRefused(str(exc)) from exc
            raise

    async def history(
        self,
        conversation_id: str,
        user: str,
        limit: int = 100,
        *,
        after: str | None = None,
        before: str | None = None,
        order: Order = "asc",
    ) -> HistoryPage:
        where = span(after, before, order)
        if where.empty:
            return HistoryPage([], has_more=False)
        found = await anyio.to_thread.run_sync(self._history, conversation_id, user, limit, where)
        return where.page(found, limit)

    # The conversation locks' three steps (edge/messages/conversation_lock.py), each one conditional
    # call: blocking, run on the locks' own worker threads.
    def take_lock(
        self, user: str, conversation_id: str, holder: str, now: float, expires_at: float
    ) -> Taken | None:
        try:
            answer = self._client.update_item(
                TableName=self._table,
                Key=_lock_key(user, conversation_id),
                UpdateExpression=f"SET holder = :me, {TTL_ATTRIBUTE} = :end",
                ConditionExpression=(
                    f"attribute_not_exists({PARTITION_KEY}) OR attribute_not_exists(holder)"
                    f" OR {TTL_ATTRIBUTE} <= :now"
                ),
                ExpressionAttributeValues={
                    ":me": {"S": holder},
                    ":end": {"N": _ttl_seconds(expires_at)},
                    ":now": {"N": repr(now)},
                },
                ReturnValues="ALL_OLD",
            )
        except ClientError as exc:
            if _condition_failed(exc):
                return None
            raise
        last = answer.get("Attributes", {}).get(LAST_MESSAGE_ID)
        return Taken(last["S"] if last else None)

    def renew_lock(self, user: str, conversation_id: str, holder: str, expires_at: float) -> bool:
        try:
            self._client.update_item(
                TableName=self._table,
                Key=_lock_key(user, conversation_id),
                UpdateExpression=f"SET {TTL_ATTRIBUTE} = :end",
                ConditionExpression="holder = :me",
                ExpressionAttributeValues={":end": {"N": _ttl_seconds(expires_at)}, ":me": {"S": holder}},
            )
        except ClientError as exc:
            if _condition_failed(exc):
                return False
            raise
        return True

    def release_lock(
        self, user: str, conversation_id: str, holder: str, kept_until: float, last_message_id: str | None
    ) -> None:
        values: dict[str, AttributeValueTypeDef] = {
            ":me": {"S": holder},
            ":end": {"N": _ttl_seconds(kept_until)},
        }
        update = f"SET {TTL_ATTRIBUTE} = :end"
        if last_message_id is not None:
            update += f", {LAST_MESSAGE_ID} = :last"
            values[":last"] = {"S": last_message_id}
        try:
            self._client.update_item(
                TableName=self._table,
                Key=_lock_key(user, conversation_id),
                UpdateExpression=f"{update} REMOVE holder",
                ConditionExpression="holder = :me",
                ExpressionAttributeValues=values,
            )
        except ClientError as exc:
            if not _condition_failed(exc):  # another holds it now (this one expired): theirs
                raise

    async def create_table_if_missing(self) -> None:
        """For a local DynamoDB-compatible endpoint; in AWS the table comes from Terraform."""
        await anyio.to_thread.run_sync(self._create_table_if_missing)

    async def aclose(self) -> None:
        await anyio.to_thread.run_sync(self._client.close)

    def _history(self, conversation_id: str, user: str, limit: int, where: Span) -> list[StoredMessage]:
        """What a page of `limit` reads of the owner's messages in the span (store.reads), in the
        order it is read: from its own partition, merged with those of the client's id written
        before partitions named their owner."""
        owned = owned_partition(user, conversation_id)
        # Past the partition key's bytes (a user named before names were bounded, or imported from
        # a keys file): no message can be there (append: MessageRefused), and the Query was refused
        # (a ValidationException, the route's 503 store_unavailable for good).
        fits = len(owned.encode()) <= MAX_PARTITION_KEY_BYTES
        found = self._read(owned, user, limit, where) if fits else []
        if not LEGACY_PARTITIONS or "/" in conversation_id:  # no legacy id holds one
            return found
        if len(conversation_id.encode()) > MAX_PARTITION_KEY_BYTES:
            # Nor any legacy partition of an id past the key's bytes (the history route takes any id
            # in its path; a chat request's is 256 characters at most): asked, AWS refuses the Query
            # (a ValidationException, the route's 503 store_unavailable for an id that cannot exist).
            return found
        legacy = self._read(conversation_id, user, limit, where)
        if not legacy:
            return found
        merged = heapq.merge(found, legacy, key=lambda m: m.message_id, reverse=not where.ascending)
        return reads(merged, limit)

    def _read(self, partition: str, user: str, limit: int, where: Span) -> list[StoredMessage]:
        """What a page of `limit` reads of the owner's messages in the span in one partition
        (store.reads), in the order read: Query pages past the page's text budget stay unread."""
        values: dict[str, AttributeValueTypeDef] = {
            ":c": {"S": partition},
            ":u": {"S": user},
            ":now": {"N": str(int(time.time()))},
        }
        # The cursors are a condition on the sort key: the query starts at the cursor, however deep
        # into the conversation, and reads (and bills) only from there. BETWEEN takes its bounds
        # in, so the cursors' own messages are left out below.
        key = f"{PARTITION_KEY} = :c"
        if where.above is not None and where.below is not None:
            key += f" AND {SORT_KEY} BETWEEN :above AND :below"
        elif where.above is not None:
            key += f" AND {SORT_KEY} > :above"
        elif where.below is not None:
            key += f" AND {SORT_KEY} < :below"
        if where.above is not None:
            values[":above"] = {"S": where.above}
        if where.below is not None:
            values[":below"] = {"S": where.below}
        bounds = {where.above, where.below}
        found: list[StoredMessage] = []
        start: dict[str, Any] | None = None
        while not full(found, limit):
            params: QueryInputTypeDef = {
                "TableName": self._table,
                "KeyConditionExpression": key,
                # DynamoDB's TTL deletes expired items when it gets to them (up to days later), and
                # a query returns them until then: a prompt past ttl_days is filtered out here.
                "FilterExpression": f"#owner = :u AND {TTL_ATTRIBUTE} > :now",
                "ExpressionAttributeNames": {"#owner": "owner"},
                "ExpressionAttributeValues": values,
                "ScanIndexForward": where.ascending,
                "Limit": _PAGE,
                "ConsistentRead": True,
            }
            if start:
                params["ExclusiveStartKey"] = start
            page = self._client.query(**params)
            items = page.get("Items", [])
            found.extend(_message(item) for item in items if item[SORT_KEY]["S"] not in bounds)
            start = page.get("LastEvaluatedKey")
            if not start:
                break
        return reads(found, limit)

    def _create_table_if_missing(self) -> None:
        make_table_if_missing(
            self._client,
            self._table,
            lambda: self._client.create_table(
                TableName=self._table,
                AttributeDefinitions=[
                    {"AttributeName": PARTITION_KEY, "AttributeType": "S"},
                    {"AttributeName": SORT_KEY, "AttributeType": "S"},
                ],
                KeySchema=[
                    {"AttributeName": PARTITION_KEY, "KeyType": "HASH"},
                    {"AttributeName": SORT_KEY, "KeyType": "RANGE"},
                ],
                BillingMode="PAY_PER_REQUEST",
            ),
        )
