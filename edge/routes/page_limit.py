"""A list endpoint's `limit` query parameter, refused as OpenAI refuses it, naming it."""

from __future__ import annotations

import re

from litestar.openapi.spec import OpenAPIType, Schema

from edge.errors import invalid_request

_INTEGER = re.compile(r"-?[0-9]{1,20}")


def page_limit(value: str | None, default: int, maximum: int) -> int:
    """OpenAI's messages for a bad integer parameter, naming it (Litestar's own 400 said
    "Validation failed" with no param)."""
    if value is None:
        return default
    if not _INTEGER.fullmatch(value):
        raise invalid_request(
            f"Invalid type for 'limit': expected an integer, but got {value[:64]!r} instead.",
            "limit",
            code="invalid_type",
        )
    limit = int(value)
    if limit < 1:
        raise invalid_request(
            f"Invalid 'limit': integer below minimum value. Expected a value >= 1, but got {limit} instead.",
            "limit",
            code="integer_below_min_value",
        )
    if limit > maximum:
        raise invalid_request(
            f"Invalid 'limit': integer above maximum value. Expected a value <= {maximum}, "
            f"but got {limit} instead.",
            "limit",
            code="integer_above_max_value",
        )
    return limit


def limit_schema(default: int, maximum: int) -> Schema:
    """What `page_limit` takes, for the OpenAPI document (edge/openapi.py's `with_query`)."""
    return Schema(type=OpenAPIType.INTEGER, minimum=1, maximum=maximum, default=default)
