"""A table made at a local DynamoDB-compatible endpoint, which nobody ran Terraform for (in AWS the
tables come from iac/): each edge process makes the tables it uses as it starts, and the workers of
`floodgate serve --workers N` start at once. On a first start each asked whether the table was
there, found none and made it: all but the first were refused (ResourceInUseException) and their
edges failed at start. A table another process made meanwhile is the one wanted."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient


def make_table_if_missing(client: DynamoDBClient, table: str, create: Callable[[], object]) -> None:
    """`create()` (a CreateTable of `table`) unless the table is there, then wait until it is
    ACTIVE: one still being made (by this call or another process's) refuses reads and writes."""
    try:
        found = client.describe_table(TableName=table)["Table"]
    except client.exceptions.ResourceNotFoundException:
        try:
            create()
        except client.exceptions.ResourceInUseException:
            pass  # another process (a worker beside this one) made it first
    else:
        if found.get("TableStatus") == "ACTIVE":
            return
    client.get_waiter("table_exists").wait(TableName=table, WaiterConfig={"Delay": 1, "MaxAttempts": 60})
