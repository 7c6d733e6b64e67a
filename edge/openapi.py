"""The OpenAPI document Litestar serves at /schema/openapi.json.

The chat route reads its body itself (edge/schemas.py, one msgspec pass with OpenAI-style errors),
so Litestar sees no `data` parameter to describe: its request body is the msgspec schema of
ChatCompletionRequest, bounds included, placed by `ChatCompletionOperation`. Clients and fuzzers
(tests/faults/test_schemathesis.py) read the same bounds the parser enforces.

Every operation documents its failures as what the edge sends (`ApiOperation`): the OpenAI error
object of edge/errors.py, for any 4xx or 5xx. Litestar's own entry, a 400 of `{status_code, detail,
extra}` added wherever a handler takes parameters, described a body the edge never sends, and
the 401/404/409/413/429/503 the edge does send were not in the document at all.

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
from litestar.openapi.spec import (
    Components,
    OpenAPIMediaType,
    OpenAPIResponse,
    OpenAPIType,
    Operation,
    Parameter,
    Reference,
    RequestBody,
    Schema,
    SecurityScheme,
)
from litestar.routes import BaseRoute
from litestar.types import ControllerRouterHandler

from edge.errors import ErrorBody
from edge.schemas import ChatCompletionRequest

SCHEMA_PATH = "/schema"  # the document is at SCHEMA_PATH + "/openapi.json"
_REF_PREFIX = "#/components/schemas/"


def _inlined(node: Any, components: dict[str, Any]) -> Any:
    """`node` with every reference to `components` replaced by the schema it names (the request's
    types refer to none of their own: no reference leads back to itself). What stands beside the
    reference (a type's `extra_json_schema`, as a chat message's rule for its content) is kept."""
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith(_REF_PREFIX):
            beside = {key: value for key, value in node.items() if key != "$ref"}
            return _inlined({**components[ref[len(_REF_PREFIX) :]], **beside}, components)
        return {key: _inlined(value, components) for key, value in node.items()}
    if isinstance(node, list):
        return [_inlined(value, components) for value in node]
    return node


def _schema_of(kind: type[Any]) -> Schema:
    """`kind`'s msgspec JSON Schema, bounds included, with no references left in it. Litestar
    writes plain dicts through as they are: msgspec's JSON Schema needs no conversion."""
    (ref,), components = msgspec.json.schema_components([kind], ref_template=_REF_PREFIX + "{name}")
    return cast(Schema, _inlined(ref, components))


def _json(kind: type[Any]) -> dict[str, OpenAPIMediaType]:
    return {"application/json": OpenAPIMediaType(schema=_schema_of(kind))}


# Every 4xx and 5xx the edge answers with a body is this object (edge/errors.py); the ranges, not a
# list of codes, since one route's codes depend on the settings (a 429 per limit, a 503 per store).
_ERROR_RESPONSES: dict[str, OpenAPIResponse | Reference] = {
    "4XX": OpenAPIResponse(
        description="The request was refused: an OpenAI error object.", content=_json(ErrorBody)
    ),
    "5XX": OpenAPIResponse(
        description="The server could not answer: an OpenAI error object.", content=_json(ErrorBody)
    ),
}


@dataclass
class ApiOperation(Operation):
    """An operation of the public API: its failures documented as the error object it sends."""

    def __post_init__(self) -> None:
        kept = {code: answer for code, answer in (self.responses or {}).items() if code[0] not in "45"}
        self.responses = {**kept, **_ERROR_RESPONSES}


@dataclass
class ProbeOperation(ApiOperation):
    """/healthz and /readyz: answered without a key (load balancers send none), which the document's
    global bearer requirement said they needed."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.security = []


# A chat completion's 200: one JSON object, or with `stream` server-sent events (it was documented as
# JSON alone, and a streamed answer did not match the document).
_COMPLETION = OpenAPIResponse(
    description="The completion: one JSON object, or with `stream` server-sent events.",
    content={
        "application/json": OpenAPIMediaType(schema=Schema()),
        "text/event-stream": OpenAPIMediaType(schema=Schema(type=OpenAPIType.STRING)),
    },
)


@dataclass
class ChatCompletionOperation(ApiOperation):
    """POST /v1/chat/completions, with the body the route parses by hand, and its 200 in either of
    the two forms `stream` picks."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.request_body = RequestBody(content=_json(ChatCompletionRequest), required=True)
        self.responses = {**(self.responses or {}), "200": _COMPLETION}


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


def with_json_body(kind: type[Any], *, required: bool) -> type[ApiOperation]:
    """The operation of a route that reads its JSON body itself (`await request.body()`, decoded as
    `kind`): Litestar sees no `data` parameter, so without this the document said the route takes
    no body at all."""

    @dataclass
    class BodyOperation(ApiOperation):
        def __post_init__(self) -> None:
            super().__post_init__()
            self.request_body = RequestBody(content=_json(kind), required=required)

    return BodyOperation


def with_query(schemas: dict[str, Schema]) -> type[ApiOperation]:
    """The operation of a route that reads its query parameters as strings and checks them itself
    (OpenAI's messages, naming the parameter): Litestar documented each as any string, `limit` and
    the days included, so a client generated from the document typed them so, and what the document
    allowed (`limit=`, `order=`, `end=0`) was a 400. `schemas` says what each name really takes."""

    @dataclass
    class QueryOperation(ApiOperation):
        def __post_init__(self) -> None:
            super().__post_init__()
            for parameter in self.parameters or []:
                if not isinstance(parameter, Parameter) or parameter.param_in != "query":
                    continue
                if parameter.name in schemas:
                    parameter.schema = schemas[parameter.name]

    return QueryOperation
