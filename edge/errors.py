"""OpenAI-shaped error bodies, and the handlers that make every failure one (never a traceback)."""

from __future__ import annotations

import math
import re
import sqlite3
from collections.abc import Mapping
from typing import Any

import msgspec
import structlog
from botocore.exceptions import BotoCoreError, ClientError
from litestar import Request, Response
from litestar.exceptions import HTTPException
from redis.exceptions import RedisError

from edge.admission.ticket import NeverFits, Overloaded
from edge.log_line import refusal_line
from edge.metrics import REQUESTS_REJECTED
from edge.request_ids import new_refusal_id
from edge.routes.head import allow_with_head
from edge.routes.listeners import as_served_here

log = structlog.get_logger("floodgate.errors")

# An unknown path is echoed in its 404 up to this many characters (the request line may be longer).
MAX_PATH_IN_ERROR = 256
# A value the client sent is echoed in its error up to this many characters (`shown`).
MAX_VALUE_IN_ERROR = 64
_QUOTED_LONG = re.compile("'([^']{" + str(MAX_VALUE_IN_ERROR + 1) + ",})'")
# The scope key under which the chat route leaves the user its key named (edge/routes/chat.py), for
# the line of a refusal that comes after the key was read (a 400 for the body, a 404 model).
REQUEST_USER = "floodgate.user"
# The scope key under which the chat route leaves the configured model a request reached (its
# dispatcher's metric name), for floodgate_requests_rejected_total's `model`: absent, "" (no
# model was reached, and a name the client sent must not become a series).
REQUEST_MODEL = "floodgate.model"
NO_MODEL = ""
# The scope key under which the routes leave the caller's tier once its key is read, where that
# tier is configured, for floodgate_requests_rejected_total's `tier`: absent, "" (refused before
# the key was read, or a key of a tier the settings no longer name: a series per such name would
# grow with the key store, not the configuration).
REQUEST_TIER = "floodgate.tier"
NO_TIER = ""

_TYPE_BY_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    # OpenAI types every 404 (an unknown model, URL or object) so: a client branching on the type
    # did not know "not_found_error", which OpenAI never sends. The code tells the 404s apart.
    404: "invalid_request_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    409: "conflict_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_exceeded",
    503: "service_unavailable",
}


class ErrorDetail(msgspec.Struct, omit_defaults=False):
    message: str
    type: str
    param: str | None = None
    code: str | None = None
    # Set only in an error event (`in_stream`), which has no headers to carry them: what its answer's
    # `retry-after-ms` and `x-should-retry` say. Unset, they are left out of the object (OpenAI's
    # four fields alone); the SDKs keep unknown fields of an error object (openai's APIError.body).
    retry_after_ms: int | msgspec.UnsetType = msgspec.UNSET
    should_retry: bool | msgspec.UnsetType = msgspec.UNSET


class ErrorBody(msgspec.Struct):
    error: ErrorDetail


class ApiError(Exception):
    """An error the client caused or must react to, answered as an OpenAI error object."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str | None = None,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.detail = ErrorDetail(
            message=message, type=type or _TYPE_BY_STATUS.get(status, "api_error"), param=param, code=code
        )
        self.headers = headers or {}
        # The error an admitted request ended with (Generation.complete): counted already, by how
        # it ended, in floodgate_requests_finished_total, which its handler leaves it to.
        self.finished = False


def closing_error_response(
    status_line: bytes,
    message: str,
    code: str,
    *,
    type: str = "invalid_request_error",  # the field's name, as ApiError's
    header_lines: bytes = b"",
) -> bytes:
    """A whole HTTP/1.1 error response that closes its connection, as bytes for a protocol to write
    itself where no request reached the app (a header deadline, a head too large). `header_lines`:
    more of them, each ending in CRLF."""
    body = msgspec.json.encode(ErrorBody(ErrorDetail(message=message, type=type, code=code)))
    head = (
        b"HTTP/1.1 %s\r\ncontent-type: application/json\r\nconnection: close\r\n%scontent-length: %d\r\n\r\n"
        % (status_line, header_lines, len(body))
    )
    return head + body


def invalid_request(message: str, param: str | None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


def conversation_locked() -> ApiError:
    """Another request of the user runs on the conversation (edge/messages/conversation_lock.py):
    OpenAI's Responses API answer, word for word, and like it no Retry-After (it sends none)."""
    return invalid_request(
        "Another process is currently operating on this conversation. Please retry in a few seconds.",
        "conversation_id",
        code="conversation_locked",
    )


def client_closed_request(message: str) -> ApiError:
    """The 499 (nginx's "client closed request") of a request whose client left before it was
    admitted: nobody reads it, but it counts as the client's doing, where a 500 counted as the
    server's fault."""
    return ApiError(499, message, code="client_closed_request")


def retry_after_headers(retry_after_s: float) -> dict[str, str]:
    """Retry-After in whole seconds, rounded up, plus the exact wait the OpenAI SDK prefers."""
    ms = max(0, math.ceil(retry_after_s * 1000))
    return {"retry-after": str(max(1, math.ceil(ms / 1000))), "retry-after-ms": str(ms)}


def shown(value: str) -> str:
    """`value` as an error echoes it: its first MAX_VALUE_IN_ERROR characters, an ellipsis past them.
    Echoed whole, a role or a type of 200 KB came back in a 200 KB message, as the model's name
    (cut so) never did."""
    return value if len(value) <= MAX_VALUE_IN_ERROR else value[:MAX_VALUE_IN_ERROR] + "…"


def quoted_values_shown(message: str) -> str:
    """A message that quotes what the client sent ('...', as msgspec's validation errors do), each
    quoted value `shown`."""
    return _QUOTED_LONG.sub(lambda m: "'" + shown(m.group(1)) + "'", message)


def wait_text(seconds: float) -> str:
    """A wait as a person reads it, as OpenAI writes it in its messages: 850ms, 3.89s, 6m0s, 2h5m
    (Python's 3.6e+03s said an hour to nobody)."""
    if seconds < 1:
        return f"{math.ceil(seconds * 1000)}ms"
    if seconds < 60:
        # Rounded up at the last digit shown: a client that waits what it reads must not come back
        # before the wait is over, to be refused again (1.2345 s read as 1.23 s did; a review).
        if seconds < 10:
            return f"{math.ceil(seconds * 100 - 1e-9) / 100:.3g}s"
        return f"{math.ceil(seconds * 10 - 1e-9) / 10:.3g}s"
    whole = math.ceil(seconds)
    if whole < 3600:
        return f"{whole // 60}m{whole % 60}s"
    # Whole minutes, rounded up as the shorter waits are: floored, 1h26m24s read as 1h26m, and a
    # client that waited that long was refused again.
    minutes = -(-whole // 60)
    return f"{minutes // 60}h{minutes % 60}m"


def rate_limited(
    message: str, code: str, retry_after_s: float, headers: dict[str, str] | None = None
) -> ApiError:
    return ApiError(
        429,
        message,
        type="rate_limit_exceeded",
        code=code,
        headers={**(headers or {}), **retry_after_headers(retry_after_s)},
    )


def error_response(
    status: int, detail: ErrorDetail, headers: dict[str, str] | None = None
) -> Response[bytes]:
    return Response(
        msgspec.json.encode(ErrorBody(detail)),
        status_code=status,
        media_type="application/json",
        headers=headers,
    )


# The longest Retry-After the OpenAI SDKs wait out. Past it, the 1.x Python SDK (and the Node SDK)
# ignore the header and retry on their own backoff, after 0.5 s and 1 s: a token budget that refills
# in ten minutes was asked again twice within two seconds, by every client at once.
SDK_RETRY_AFTER_MAX_S = 60


def final_if_far(headers: dict[str, str]) -> dict[str, str]:
    """`x-should-retry: false` where the answer's Retry-After is beyond what an SDK waits out, so no
    SDK retries it at once; a wait it does honour keeps its automatic retry."""
    retry_after = headers.get("retry-after")
    if "x-should-retry" in headers or retry_after is None or not retry_after.isdigit():
        return headers
    if int(retry_after) > SDK_RETRY_AFTER_MAX_S:
        return {**headers, "x-should-retry": "false"}
    return headers


def in_stream(error: ApiError) -> ErrorDetail:
    """The error object of an error event: a stream's status (200) and headers are gone, so the
    retry hint its answer would carry as headers (`final_if_far` included, as `handle_api_error`
    sends them) goes in the object itself. A replica that failed mid-stream said nothing there of
    when to retry or whether to, where its 502 said both (`upstream_error`)."""
    headers = final_if_far(error.headers)
    detail = error.detail
    wait_ms = headers.get("retry-after-ms")
    if wait_ms is not None and wait_ms.isdigit():
        detail = msgspec.structs.replace(detail, retry_after_ms=int(wait_ms))
    should_retry = headers.get("x-should-retry")
    if should_retry in ("true", "false"):
        detail = msgspec.structs.replace(detail, should_retry=should_retry == "true")
    return detail


def log_refusal(scope: Mapping[str, Any], status: int, code: str) -> dict[str, str]:
    """The one line of a request answered with an error before it got a request id (a 400 for its
    body, a 401, a 404, a 413), under a refusal id of its own (edge/request_ids.py), returned as the
    `x-request-id` header the answer carries: a user reporting that every call answers 400 quotes
    it, and the operator finds the line (none bound by an earlier request may stand for it). One
    that has an id (the limiter's or the queue's refusal, a generation's error) has its line
    already (`chat_refused`, `chat_completion`)."""
    request_id = new_refusal_id()
    path = scope.get("path")  # none where the protocol refused the request's head (closing_refusal)
    fields = {
        "request_id": request_id,
        "user": scope.get(REQUEST_USER),
        # As a chat_refused or chat_completion line names it: an operator filtering a tier's
        # lines missed its 400s, 404s and 413s.
        "tier": scope.get(REQUEST_TIER),
        "method": scope.get("method"),
        "path": path[:MAX_PATH_IN_ERROR] if path is not None else None,
        "status": status,
        "code": code,
    }
    refusal_line(log, "request_refused", fields)
    return {"x-request-id": request_id}


def count_refusal(scope: Mapping[str, Any], status: int, code: str) -> None:
    """One more in floodgate_requests_rejected_total, under the model and tier the request reached
    (`REQUEST_MODEL`, `REQUEST_TIER`; "" where it reached none)."""
    model, tier = scope.get(REQUEST_MODEL, NO_MODEL), scope.get(REQUEST_TIER, NO_TIER)
    REQUESTS_REJECTED.labels(str(status), code, model, tier).inc()


def handle_api_error(request: Request[Any, Any, Any], exc: ApiError) -> Response[bytes]:
    code = exc.detail.code or exc.detail.type
    if not exc.finished:
        count_refusal(request.scope, exc.status, code)
    headers = exc.headers
    if "x-request-id" not in headers:
        headers = {**headers, **log_refusal(request.scope, exc.status, code)}
    return error_response(exc.status, exc.detail, final_if_far(headers))


def handle_http_exception(request: Request[Any, Any, Any], exc: HTTPException) -> Response[bytes]:
    # Litestar's own errors (404 route, 405 method, 413 body) in the OpenAI shape; a 405 for a path
    # the listener does not serve is that path's 404 (edge/routes/listeners.py).
    exc = as_served_here(request.scope, exc)
    status = exc.status_code
    if status == 404:
        # Every 404 raised as an HTTPException is a path nothing serves (the router's, or a
        # listener's or the admin API's "as an unknown path"): named as OpenAI names it.
        message = f"Invalid URL ({request.method} {request.scope['path'][:MAX_PATH_IN_ERROR]})"
    else:
        message = exc.detail if status != 413 else "Request body too large."
    code = "request_too_large" if status == 413 else None
    detail = ErrorDetail(message=message, type=_TYPE_BY_STATUS.get(status, "api_error"), code=code)
    allow = next((v for k, v in (exc.headers or {}).items() if k.lower() == "allow"), None)
    # A path with GET answers HEAD too (edge/routes/head.py): its Allow says so.
    headers = {"allow": allow_with_head(allow)} if allow is not None else {}
    count_refusal(request.scope, status, detail.code or detail.type)
    headers |= log_refusal(request.scope, status, detail.code or detail.type)
    return error_response(status, detail, headers)


# What a backing store (keys and usage, messages, the cancel bus) raises when it cannot answer: the
# store's trouble, not a bug of ours and not the client's, so 503 + Retry-After rather than 500.
STORE_ERRORS: tuple[type[Exception], ...] = (sqlite3.Error, RedisError, BotoCoreError, ClientError)


def handle_store_error(request: Request[Any, Any, Any], exc: Exception) -> Response[bytes]:
    # Named as a refusal is (log_refusal), the id in its line and its answer: one an earlier
    # request bound on this connection's context must not stand for it.
    request_id = new_refusal_id()
    log.warning(
        "store_unavailable", request_id=request_id, path=request.url.path, error_type=type(exc).__name__
    )
    count_refusal(request.scope, 503, "store_unavailable")
    detail = ErrorDetail(
        message="A backing store is not answering right now; please retry.",
        type=_TYPE_BY_STATUS[503],
        code="store_unavailable",
    )
    return error_response(503, detail, {**retry_after_headers(1.0), "x-request-id": request_id})


def internal_error() -> ApiError:
    """A fault of the server's own (a bug): 500, in OpenAI's words for it."""
    return ApiError(500, "The server had an error while processing your request.", type="api_error")


def handle_unexpected(request: Request[Any, Any, Any], exc: Exception) -> Response[bytes]:
    request_id = new_refusal_id()  # as handle_store_error's: the id a user reporting the 500 quotes
    log.error(
        "unhandled_error",
        request_id=request_id,
        path=request.url.path,
        error_type=type(exc).__name__,
        exc_info=exc,
    )
    detail = internal_error().detail
    # Counted, or the server's own faults would be the one error status /metrics never shows.
    count_refusal(request.scope, 500, detail.type)
    return error_response(500, detail, {"x-request-id": request_id})


def overloaded_error(exc: Overloaded, headers: dict[str, str] | None = None) -> ApiError:
    """Queue full or too slow: 429, as a rate limit. No replica at all: 503, the service is down."""
    message = f"The service is overloaded ({exc.reason}). Please try again in {wait_text(exc.retry_after_s)}."
    if exc.reason == "no_replica":
        message = f"No model replica is available. Please try again in {wait_text(exc.retry_after_s)}."
        return ApiError(
            503,
            message,
            code=exc.reason,
            headers={**(headers or {}), **retry_after_headers(exc.retry_after_s)},
        )
    return rate_limited(message, exc.reason, exc.retry_after_s, headers)


def never_fits_error(exc: NeverFits) -> ApiError:
    """No replica could ever hold the request: 400 at once, as vLLM answers a prompt longer than its
    model holds, naming the limit. Too many tokens: `context_length_exceeded`, the code on which
    clients trim their history, which makes it fit; no sequence for the tier at all (only the paid
    reserve can take them all: a replica of no sequence has not said its size, Replica.size_known):
    nothing the client sends fits, so a code of its own."""
    # Where this server fills a fixed share of replicas other servers fill too (the in-memory
    # limiter's instance_count), the limit is that share's.
    share = "this server's share of " if exc.shared else ""
    if not exc.sequences:
        if exc.shared:
            # A fixed share can hold no sequence for any tier (more instances than a replica runs
            # sequences): a paid user was told of the free tier and the paid reserve.
            less = "" if exc.may_use_reserve else ", less the paid reserve,"
            cause = f"This server's share of the model replicas{less} holds no sequence for your tier"
        else:
            cause = "The paid reserve leaves the free tier no sequence on any model replica"
        message = f"{cause}: no request of your tier can run here."
        return invalid_request(message, None, code="tier_not_served")
    if exc.may_use_reserve:
        limit = f"{share}a replica holds at most {exc.kv_limit}"
    else:
        limit = f"the free tier may use at most {exc.kv_limit} {'of ' + share if share else 'on '}any replica"
    # The split, as the context's refusal gives it (pipeline.py): the prompt's part is what a
    # client (the playground) subtracts from the limit to name a max_tokens that fits.
    split = (
        ""
        if exc.prompt_tokens is None
        else f" ({exc.prompt_tokens} in the messages, {exc.kv_tokens - exc.prompt_tokens} in the completion)"
    )
    return invalid_request(
        f"This request needs {exc.kv_tokens} tokens of KV cache{split}; {limit}. Please reduce the length "
        "of the messages or completion.",
        "messages",
        code="context_length_exceeded",
    )


def upstream_error(retry_after_s: float | None = None, *, final: bool = False) -> ApiError:
    """The replica failed while generating: 502, as vLLM's server and OpenAI answer a backend's
    failure. With `retry_after_s` (the replica is being restarted, or the queue said when another
    try would find room) it says when a retry should succeed: the OpenAI SDK honours it on a 502,
    where without one it retries after half a second and again after one, and gave up before a
    restarted engine served again. `final`: the request may be what killed the replica, so it says
    not to send it again (`x-should-retry: false`, which the OpenAI SDK obeys); a client may still,
    after a look at what it sent."""
    headers = {} if retry_after_s is None else retry_after_headers(retry_after_s)
    if final:
        headers["x-should-retry"] = "false"
    return ApiError(
        502,
        "The model replica failed while generating.",
        type="api_error",
        code="upstream_error",
        headers=headers,
    )


def limiter_unavailable(retry_after_s: float) -> ApiError:
    """The limiter's store cannot answer and the tier fails closed: at admission, or mid-stream
    where nothing vouches for more of the user's tokens. A 503 to retry, never a budget's end. The
    message says the wait too: an error event has no Retry-After header, and clients read it there
    (floodgate_client, as OpenAI writes it)."""
    return ApiError(
        503,
        f"Rate limiting is unavailable. Please try again in {wait_text(retry_after_s)}.",
        code="limiter_unavailable",
        headers=retry_after_headers(retry_after_s),
    )


# A draining instance's Retry-After: the client's next try, on a new connection, goes to another
# instance (the load balancer stops routing here within its health check's interval), so it need not
# wait for this one's drain. The rest of the accept window it said before (15 s by default) had the
# OpenAI SDK wait 14.8 s for an answer another instance gave at once.
DRAINING_RETRY_AFTER_S = 1.0


def shutting_down_error() -> ApiError:
    """This instance is draining (SIGTERM): another instance will take the request."""
    return ApiError(
        503,
        "This server is shutting down. Please retry; another instance will take the request.",
        code="server_shutting_down",
        headers=retry_after_headers(DRAINING_RETRY_AFTER_S),
    )
