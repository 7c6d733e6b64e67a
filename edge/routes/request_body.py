"""A chat request's body and Authorization header, read straight from the ASGI scope and receive.

Litestar's `request.body()` builds the whole header mapping to find Content-Length, wraps the
reads in an async generator and a list comprehension, and caches the result in the connection
state: about 5 % of a one-token stream's CPU (docs/bench-streams.md) for a body that is almost
always one `http.request` message. Same limits and errors as Litestar's: a declared
Content-Length over `max_bytes` is refused before reading, so is a body that grows past it while
read (413, `RequestEntityTooLarge`, answered in the OpenAI shape by edge/errors.py). A client that
disconnects before the end of its body hears nothing, but Litestar's answer there is a 500, which
counts in the metrics and alerts as the server's fault: here it is 499 (nginx's "client closed
request"), counted as `floodgate_requests_rejected_total{status="499"}`.
"""

from __future__ import annotations

from typing import cast

from litestar.exceptions import ClientException
from litestar.exceptions.http_exceptions import RequestEntityTooLarge
from litestar.types import HTTPReceiveMessage, Receive, Scope

from edge.errors import ApiError, client_closed_request
from edge.keys.authorization_header import several_authorization_headers


def unsupported_content_encoding() -> ApiError:
    return ApiError(
        415,
        "The request body must not be compressed: send it without a Content-Encoding.",
        code="unsupported_content_encoding",
        # RFC 9110 12.5.3: a 415 for a content coding names the codings the server accepts.
        headers={"accept-encoding": "identity"},
    )


def is_content_coded(value: bytes) -> bool:
    """Whether a Content-Encoding names a coding (gzip, br, ...): nothing here decodes one."""
    return any(coding.strip() not in (b"", b"identity") for coding in value.lower().split(b","))


# How much of a refused Content-Type its 400 echoes, as the other messages cut what the user sent.
_MAX_TYPE_IN_ERROR = 64


def unsupported_content_type(value: bytes) -> ApiError:
    """OpenAI's answer (status, code, words) to a body labelled other than JSON."""
    named = value.decode("latin-1")[:_MAX_TYPE_IN_ERROR]
    return ApiError(
        400,
        f"Unsupported content type: '{named}'. This API method only accepts 'application/json' "
        "requests: send the body with the header 'Content-Type: application/json'.",
        code="unsupported_content_type",
    )


def is_json_type(value: bytes) -> bool:
    """Whether a Content-Type names JSON (application/json, or RFC 6839's application/*+json),
    whatever its parameters and case, or names nothing: vLLM (FastAPI) reads just these as JSON."""
    media_type = value.split(b";", 1)[0].strip().lower()
    main, _, sub = media_type.partition(b"/")
    return not media_type or (main == b"application" and (sub == b"json" or sub.endswith(b"+json")))


def authorization_and_length(scope: Scope) -> tuple[str | None, int | None]:
    """The Authorization header and the declared Content-Length, from the raw headers in one pass
    (several Authorization headers: the 400 edge/keys/authorization_header.py gives). A body in a
    content coding (gzip, br, ...) is refused, 415: nothing here decodes one, and a gzipped body
    read as JSON was a misleading 400, one merely labelled so was served as plain. A body labelled
    other than JSON (a form's, text/plain) is refused, 400, as OpenAI refuses it: it was read as
    JSON all the same. One without a Content-Type is read as JSON, as vLLM reads it."""
    authorization: str | None = None
    length: bytes | None = None
    for name, value in scope["headers"]:
        if name == b"authorization":
            if authorization is not None:
                raise several_authorization_headers()
            authorization = value.decode("latin-1")
        elif name == b"content-length":
            length = value
        elif name == b"content-encoding" and is_content_coded(value):
            raise unsupported_content_encoding()
        elif name == b"content-type" and not is_json_type(value):
            raise unsupported_content_type(value)
    if length is None:
        return authorization, None
    try:
        return authorization, int(length)
    except ValueError:
        raise ClientException(f"Invalid content-length: {length.decode('latin-1')!r}") from None


async def read_body(receive: Receive, declared: int | None, max_bytes: int | None) -> bytes:
    if max_bytes is not None and declared is not None and declared > max_bytes:
        raise RequestEntityTooLarge
    chunks: list[bytes] = []
    total = 0
    while True:
        message = cast(HTTPReceiveMessage, await receive())
        if message["type"] == "http.disconnect":
            raise client_closed_request("The client closed the connection before its request body ended.")
        body: bytes = message.get("body", b"")
        if body:
            total += len(body)
            if max_bytes is not None and total > max_bytes:
                raise RequestEntityTooLarge
            chunks.append(body)
        if not message.get("more_body", False):
            break
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)
