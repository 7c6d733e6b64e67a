"""Query parameters that take one value, refused when given more than once (the usage, key and
conversation history routes)."""

from __future__ import annotations

from typing import Any

from litestar import Request

from edge.errors import invalid_request


def refuse_repeated(request: Request[Any, Any, Any], *names: str) -> None:
    """A 400 naming the first of `names` the query gives twice. Litestar hands a str parameter one
    of the values and drops the rest, silently: `?user=a&user=b` answered for one user as if for
    both. Only on the few routes that take such parameters: the query is parsed already (its
    parameters were), so this is a lookup per name."""
    query = request.query_params
    for name in names:
        if len(query.getall(name, [])) > 1:
            raise invalid_request(f"{name} was given more than once: it takes one value.", name)
