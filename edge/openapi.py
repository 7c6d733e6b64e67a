"""The OpenAPI document Litestar serves at /schema/openapi.json.

The chat route reads its body itself (edge/schemas.py, one msgspec pass with OpenAI-style errors),
so Litestar sees no `data` parameter to describe: its request body is the msgspec schema of
ChatCompletionRequest, bounds included, placed by `ChatCompletionOperation`. Clients and fuzzers
(tests/faults/test_schemathesis.py) read the same bounds the parser enforces.

That schema is written out whole in the operation (`_inlined`), not as references to
components/schemas: Litestar fills the served document's components/schemas with the schemas it
generated itself and drops those the config names, so the body was a $ref that resolved nowhere
(and Schemathesis, unable to build one, sent no body at all).
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import Any, cast

import msgspec
from litestar import Router
from litestar.handlers import HTTPRouteHandler
from litestar.openapi import OpenAPIConfig
from litestar.openapi.plugins import JsonRenderPlugin
from litestar.openapi.spec import Components, OpenAPIMediaType, Operation, RequestBody, Schema, SecurityScheme
from litestar.routes import BaseRoute
from litestar.types import ControllerRouterHandler

from edge.schemas import ChatCompletionRequest

SCHEMA_PATH = "/schema"  # the document is at SCHEMA_PATH + "/openapi.json"
_REF_PREFIX = "#/components/schemas/"


def _inlined(node: Any, components: dict[str, Any]) -> Any:
    """`node` with every reference to `components` replaced by the schema it names (the request's
    types refer to none of their own: no reference leads back to itself)."""
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith(_REF_PREFIX):
            return _inlined(components[ref[len(_REF_PREFIX) :]], components)
        return {key: _inlined(value, components) for key, value in node.items()}
    if isinstance(node, list):
        return [_inlined(value, components) for value in node]
    return node


(_CHAT_REQUEST_REF,), _BODY_SCHEMAS = msgspec.json.schema_components(
    [ChatCompletionRequest], ref_template=_REF_PREFIX + "{name}"
)
_CHAT_REQUEST_SCHEMA = _inlined(_CHAT_REQUEST_REF, _BODY_SCHEMAS)


@dataclass
class ChatCompletionOperation(Operation):
    """POST /v1/chat/completions, with the body the route parses by hand."""

    def __post_init__(self) -> None:
        # Litestar writes plain dicts through as they are: msgspec's JSON Schema needs no conversion.
        schema = cast(Schema, _CHAT_REQUEST_SCHEMA)
        self.request_body = RequestBody(
            content={"application/json": OpenAPIMediaType(schema=schema)}, required=True
        )


# The path of the catch-all Litestar adds under SCHEMA_PATH for the paths no document is served at.
_NOT_FOUND_PAGE = "/{path:str}"


class _SchemaRouter(Router):
    """The router Litestar serves the documents on, less its catch-all: besides the documents it
    registers `/{path:str}`, which answered GET with an HTML 404 page of its own, OPTIONS with 204
    and POST with 405 where every other unknown path answers the JSON 404 for every method. Declined
    here, `/schema/<anything not served>` is an unknown path like any other."""

    def register(self, value: ControllerRouterHandler) -> list[BaseRoute]:
        if isinstance(value, HTTPRouteHandler) and _NOT_FOUND_PAGE in value.paths:
            return []
        return super().register(value)


def _version() -> str:
    try:
        return version("floodgate")
    except PackageNotFoundError:
        return "0.0.0"


def openapi_config() -> OpenAPIConfig:
    return OpenAPIConfig(
        title="Floodgate",
        version=_version(),
        # A fresh router per app: Litestar registers the documents' handlers on it.
        openapi_router=_SchemaRouter(SCHEMA_PATH, route_handlers=[], include_in_schema=False),
        render_plugins=[JsonRenderPlugin()],
        components=Components(
            security_schemes={"bearer": SecurityScheme(type="http", scheme="bearer")},
        ),
        security=[{"bearer": []}],
    )
