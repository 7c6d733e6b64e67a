"""/v1/admin/*: key lifecycle and everyone's usage, for operators.

Open only with an admin key (its SHA-256 is in `keys.admin_key_sha256`: one hash, or several while
the admin key is rotated); with none configured the whole prefix answers 404, as if it did not
exist. The public load balancer must not route /v1/admin/* at all (iac/modules/alb): this check is
the second line, not the only one."""

from __future__ import annotations

import hmac
from typing import Annotated, Any, TypeVar

import msgspec
import structlog
from litestar import Request, Router, get, post
from litestar.connection import ASGIConnection
from litestar.exceptions import NotFoundException
from litestar.handlers.base import BaseRouteHandler
from litestar.openapi.spec import OpenAPIType, Schema
from litestar.params import FromPath, FromQuery
from litestar.response.base import ASGIResponse

from edge.errors import ApiError, invalid_request
from edge.keys.authenticator import bearer_key, unauthorized
from edge.keys.authorization_header import authorization_header
from edge.keys.lifecycle import (
    InvalidPeriod,
    KeyAlreadyRotated,
    KeyNotActive,
    KeyNotFound,
)
from edge.keys.page import DEFAULT_LIMIT, KEY_ID, MAX_LIMIT
from edge.keys.record import (
    MAX_LABEL_BYTES,
    MAX_USER_BYTES,
    InvalidLabel,
    InvalidUser,
    KeyRecord,
    UnknownTier,
    hash_key,
)
from edge.keys.store import KeyIdTaken
from edge.keys.views import key_view
from edge.openapi import ApiOperation, with_json_body, with_query
from edge.routes.json_body import json_response
from edge.routes.list_page import list_page
from edge.routes.listeners import BOTH, is_options_answer
from edge.routes.page_limit import limit_schema, page_limit
from edge.routes.request_body import is_content_coded, unsupported_content_encoding
from edge.routes.single_query import refuse_repeated
from edge.routes.usage import USAGE_QUERY, usage_response
from edge.runtime import Runtime, runtime_of
from limiter.tiers import MAX_PERIOD_S

log = structlog.get_logger("floodgate.admin")

_T = TypeVar("_T")
# An answer carrying a new key: no cache on the way (a proxy, the browser's) may keep it.
NO_STORE = {"cache-control": "no-store"}


def admin_guard(connection: ASGIConnection[Any, Any, Any, Any], handler: BaseRouteHandler) -> None:
    if is_options_answer(handler):
        # Litestar's OPTIONS answer runs under the router's guard too. It answers as on any other
        # path: it tells no more than a wrong method's 405, which comes before any guard (and with
        # the admin API off, nothing is mounted: an unknown path's 404).
        return
    runtime: Runtime = connection.app.state.runtime
    expected = runtime.settings.keys.admin_key_hashes
    if not expected:
        raise NotFoundException()  # as an unknown path (the routes are mounted only with a key)
    digest = hash_key(bearer_key(authorization_header(connection.scope)))
    # Each hash compared in constant time, and every one of them (a list, not any()'s first
    # match): the answer's time says nothing of which hash, if any, a key came near.
    if not any([hmac.compare_digest(digest, hashed) for hashed in expected]):
        raise unauthorized("Incorrect admin key provided.")
    # Which admin key made a change, for its audit line (`_changed`): the start of its hash, which
    # names it among the settings' hashes while they rotate and tells nothing of the key.
    connection.state.admin_key = digest[:12]


def _changed(request: Request[Any, Any, Any], action: str, record: KeyRecord, **more: Any) -> None:
    """One line for each change to the keys, with the admin key that made it: who was given a key,
    lost one, or moved tier, and when, read from the logs (there was no line at all). Never the key
    itself, nor its hash."""
    log.info(
        "admin_key_changed",
        action=action,
        key_id=record.id,
        user=record.user,
        tier=record.tier,
        admin_key=request.state.admin_key,
        **more,
    )


def _documented(**bounds: Any) -> msgspec.Meta:
    """Bounds for the OpenAPI document alone (edge/openapi.py), not checked by the decoder: the
    server's own checks (KeyLifecycle, checked_user, checked_label) refuse these values with the
    OpenAI error naming the parameter, where msgspec's would name none (_body). Without them the
    document allowed an empty user or tier and a negative grace, which the server refused."""
    return msgspec.Meta(extra_json_schema=bounds)


# Someone (not empty, not blank: checked_user), at most MAX_USER_BYTES of UTF-8: as many characters
# at most, fewer where they take more than a byte each.
_UserName = Annotated[str, _documented(pattern="\\S", maxLength=MAX_USER_BYTES)]
# A configured tier: never empty (the configured ones are the settings', not the document's).
_TierName = Annotated[str, _documented(minLength=1)]
_Label = Annotated[str, _documented(maxLength=MAX_LABEL_BYTES)]
# checked_period: a lifetime ends in the future, a grace may end now; neither past 100 years.
_Lifetime = Annotated[float, _documented(exclusiveMinimum=0, maximum=MAX_PERIOD_S)]
_Grace = Annotated[float, _documented(minimum=0, maximum=MAX_PERIOD_S)]


class CreateKey(msgspec.Struct, forbid_unknown_fields=True):
    user: _UserName
    tier: _TierName
    label: _Label = ""
    expires_in_s: _Lifetime | None = None


class Rotate(msgspec.Struct, forbid_unknown_fields=True):
    grace_s: _Grace | None = None


class SetTier(msgspec.Struct, forbid_unknown_fields=True):
    tier: _TierName


_UTF8_BOM = b"\xef\xbb\xbf"
# A `user` filter names someone (_named_user): not empty, not blank.
_USER = Schema(type=OpenAPIType.STRING, pattern="\\S")
_KEYS_QUERY = {
    "user": _USER,
    "limit": limit_schema(DEFAULT_LIMIT, MAX_LIMIT),
    "after": Schema(type=OpenAPIType.STRING, pattern=f"^{KEY_ID.pattern}$"),
}


async def _body(request: Request[Any, Any, Any], kind: type[_T]) -> _T:
    """The JSON body, read as a chat's is (edge/routes/request_body.py, edge/schemas.py): a body in
    a content coding is refused 415 (a gzipped one was a 400 'JSON is malformed: invalid character
    (byte 0)', one merely labelled gzip was read as plain), and one leading UTF-8 BOM (some Windows
    tools write one) is skipped, not a 400."""
    for name, value in request.scope["headers"]:
        if name == b"content-encoding" and is_content_coded(value):
            raise unsupported_content_encoding()
    raw = await request.body()
    if raw.startswith(_UTF8_BOM):
        raw = raw[len(_UTF8_BOM) :]
    try:
        return msgspec.json.decode(raw or b"{}", type=kind)
    except msgspec.DecodeError as exc:
        raise invalid_request(f"Invalid request body: {exc}", None) from None


# A refused rotation or tier change is final: the OpenAI SDK, which an operator's script may use,
# retries a 409 (a lock timeout, to it) unless told otherwise.
_FINAL = {"x-should-retry": "false"}


def _lifecycle_error(exc: Exception) -> ApiError:
    if isinstance(exc, KeyIdTaken):
        # Nothing was written and fresh keys are drawn again: a retry is what is wanted.
        return ApiError(409, f"{str(exc).capitalize()}.", code="key_id_taken")
    if isinstance(exc, KeyAlreadyRotated):
        message = f"{str(exc).capitalize()}."
        return ApiError(409, message, param="key_id", code="key_already_rotated", headers=_FINAL)
    if isinstance(exc, KeyNotActive):
        message = f"{str(exc).capitalize()}."
        return ApiError(409, message, param="key_id", code="key_not_active", headers=_FINAL)
    if isinstance(exc, KeyNotFound):
        return ApiError(404, f"No active key {exc.key_id}.", param="key_id", code="key_not_found")
    return invalid_request(str(exc), "tier", code="unknown_tier")


@post("/keys", status_code=201, operation_class=with_json_body(CreateKey, required=True))
async def create_key(request: Request[Any, Any, Any]) -> ASGIResponse:
    body = await _body(request, CreateKey)
    try:
        key, record = await runtime_of(request).key_admin.create(
            body.user, body.tier, body.label, body.expires_in_s
        )
    except InvalidUser as exc:
        raise invalid_request(f"{exc}.", "user") from None
    except InvalidLabel as exc:
        raise invalid_request(f"{exc}.", "label") from None
    except InvalidPeriod as exc:
        raise invalid_request(f"{exc}.", exc.param) from None
    except (UnknownTier, KeyIdTaken) as exc:
        raise _lifecycle_error(exc) from None
    _changed(request, "create", record, expires=record.expires)
    return json_response({**key_view(record), "key": key}, status_code=201, headers=NO_STORE)


def _key_cursor(value: str | None) -> str | None:
    if value is not None and not KEY_ID.fullmatch(value):
        raise invalid_request(
            f"Invalid 'after': {value[:64]!r} is not a key id (the `id` of a key this endpoint listed).",
            "after",
            code="invalid_value",
        )
    return value


@get("/keys", operation_class=with_query(_KEYS_QUERY))
async def list_keys(
    request: Request[Any, Any, Any],
    user: FromQuery[str | None] = None,
    limit: FromQuery[str | None] = None,
    after: FromQuery[str | None] = None,
) -> ASGIResponse:
    """A page of keys in id order, as OpenAI's lists page (`limit`, `after`): all of them at once
    was one unbounded answer, and on DynamoDB a read of the whole table, usage rows and all."""
    refuse_repeated(request, "user", "limit", "after")
    # On DynamoDB the index query for an empty user is refused: a 503 whose retry never mends it.
    _named_user(user)
    size = page_limit(limit, DEFAULT_LIMIT, MAX_LIMIT)
    page = await runtime_of(request).key_admin.page_keys(user, _key_cursor(after), size)
    data = [key_view(r) for r in page.keys]
    return list_page(data, page.has_more)


@post("/keys/{key_id:str}/revoke", status_code=200, operation_class=ApiOperation)
async def revoke_key(request: Request[Any, Any, Any], key_id: FromPath[str]) -> ASGIResponse:
    try:
        revoked = await runtime_of(request).key_admin.revoke_line(key_id)
    except KeyNotFound as exc:
        raise _lifecycle_error(exc) from None
    # The older keys of its rotations still in their grace, revoked with it (KeyLifecycle.revoke_line):
    # the operator asked for one key, and these stopped working too.
    also = [key_view(r) for r in revoked.replaced]
    _changed(request, "revoke", revoked.key, also_revoked=[r.id for r in revoked.replaced])
    return json_response({**key_view(revoked.key), "also_revoked": also})


@post("/keys/{key_id:str}/rotate", status_code=200, operation_class=with_json_body(Rotate, required=False))
async def rotate_key(request: Request[Any, Any, Any], key_id: FromPath[str]) -> ASGIResponse:
    body = await _body(request, Rotate)
    try:
        rotated = await runtime_of(request).key_admin.rotate(key_id, body.grace_s)
    except (KeyNotFound, KeyIdTaken) as exc:
        raise _lifecycle_error(exc) from None
    except InvalidPeriod as exc:
        raise invalid_request(f"{exc}.", exc.param) from None
    _changed(request, "rotate", rotated.new, replaces=rotated.old.id, old_expires=rotated.old.expires)
    answer = {**key_view(rotated.new), "key": rotated.key, "replaces": key_view(rotated.old)}
    return json_response(answer, headers=NO_STORE)


@post("/keys/{key_id:str}/tier", status_code=200, operation_class=with_json_body(SetTier, required=True))
async def set_key_tier(request: Request[Any, Any, Any], key_id: FromPath[str]) -> ASGIResponse:
    body = await _body(request, SetTier)
    try:
        record = await runtime_of(request).key_admin.set_tier(key_id, body.tier)
    except (KeyNotFound, UnknownTier) as exc:
        raise _lifecycle_error(exc) from None
    _changed(request, "set_tier", record)
    return json_response(key_view(record))


@get("/usage", operation_class=with_query({**USAGE_QUERY, "user": _USER}))
async def all_usage(
    request: Request[Any, Any, Any],
    user: FromQuery[str | None] = None,
    start: FromQuery[str] = "",
    end: FromQuery[str] = "",
    limit: FromQuery[str | None] = None,
    after: FromQuery[str | None] = None,
) -> ASGIResponse:
    refuse_repeated(request, "user", "start", "end", "limit", "after")
    _named_user(user)
    return await usage_response(runtime_of(request), user, start, end, limit, after)


def _named_user(user: str | None) -> None:
    """A `user` filter must name someone: no key has an empty user (a key's user must name
    someone), so `?user=` (a script's unset variable) matched nothing, and the usage listing
    answered it with an empty list, read as that user's having no usage at all."""
    if user is not None and not user.strip():
        raise invalid_request("user must not be empty.", "user", code="invalid_value")


def admin_routes() -> Router:
    """/v1/admin/*, on both listeners (operators reach it through the operator listener: the load
    balancer never routes it). Only with an admin key configured (edge/app.py): mounted without one,
    behind a guard, each method answered differently from an unknown path (a 405 listing the API's
    methods, a 404 of its own), and the OpenAPI document listed paths that could only 404."""
    return Router(
        "/v1/admin",
        route_handlers=[create_key, list_keys, revoke_key, rotate_key, set_key_tier, all_usage],
        guards=[admin_guard],
        opt=BOTH,
    )
