"""A boto3 client, with boto3 imported when the first one is made.

boto3 and botocore.config cost about 0.2 s of CPU to import (a 2-core Xeon), a fifth of `import
edge.app` and a third of `import edge.cli`, while most edge processes never call AWS: every
`floodgate` command on a local key file, `serve` on the embedded defaults, each of the test suite's
some sixty server starts. Only the stores and clients that do call AWS pay it, once, where they
make their client. Each caller keeps its own bounds on a call (timeouts, retries) and says why.
"""

from __future__ import annotations

from typing import Any


def aws_client(
    service: str,
    *,
    region_name: str | None = None,
    endpoint_url: str | None = None,
    connect_timeout: float | None = None,
    read_timeout: float | None = None,
    retries: dict[str, Any] | None = None,
) -> Any:
    """boto3's client for `service`; a bound left None is botocore's default."""
    import boto3
    from botocore.config import Config

    given: dict[str, Any] = {
        "connect_timeout": connect_timeout,
        "read_timeout": read_timeout,
        "retries": retries,
    }
    bounds = {name: value for name, value in given.items() if value is not None}
    # boto3-stubs types client() per literal service name; the caller names its service.
    make: Any = boto3.client
    return make(service, region_name=region_name, endpoint_url=endpoint_url, config=Config(**bounds))
