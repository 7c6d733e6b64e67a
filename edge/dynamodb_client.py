"""The boto3 DynamoDB client every store of the edge uses (keys, usage, conversation messages).

botocore's defaults wait 60 s for a reply, then retry: one connection gone silent (a host lost
mid-failover, a black-holed path) held a store's call for minutes. The message writer writes one
message at a time, so every conversation's turns queued behind that one call, and a shutdown then
dropped them all; a key lookup on the request path would have held its request as long. Short
bounds instead: a silent connection costs a few seconds and the retry opens a new one.
"""

from __future__ import annotations

from typing import Any

from edge.aws_client import aws_client

# DynamoDB refuses a read or write whose partition key is longer (in UTF-8 bytes): every store
# checks its own keys against it rather than asking AWS and getting a ValidationException.
MAX_PARTITION_KEY_BYTES = 2048
# And whose sort key is longer.
MAX_SORT_KEY_BYTES = 1024


def dynamodb_client(endpoint_url: str | None) -> Any:
    """`endpoint_url`: a local DynamoDB-compatible server, or None for AWS's."""
    return aws_client(
        "dynamodb",
        endpoint_url=endpoint_url or None,
        connect_timeout=2,
        read_timeout=5,
        retries={"mode": "standard", "max_attempts": 3},
    )
