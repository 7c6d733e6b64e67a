"""POST /v1/chat/completions/{request_id}/cancel: stop one of the caller's own generations."""

from __future__ import annotations

from typing import Any

from litestar import Request, post
from litestar.params import FromPath
from litestar.response.base import ASGIResponse

from edge.cancel.bus import CancelBusUnavailable
from edge.cancel.outcome import CancelOutcome
from edge.errors import ApiError, retry_after_headers
from edge.openapi import ApiOperation
from edge.routes.caller import caller
from edge.routes.json_body import json_response
from edge.runtime import runtime_of


@post("/v1/chat/completions/{request_id:str}/cancel", status_code=200, operation_class=ApiOperation)
async def cancel_completion(request: Request[Any, Any, Any], request_id: FromPath[str]) -> ASGIResponse:
    runtime = runtime_of(request)
    principal = await caller(runtime, request)
    try:
        outcome = await runtime.registry.cancel(request_id, principal.user)
    except CancelBusUnavailable:
        raise ApiError(
            503,
            "Cancellation is unavailable right now; please retry.",
            code="cancel_unavailable",
            headers=retry_after_headers(1.0),
        ) from None
    if outcome is CancelOutcome.CANCELLED:
        return json_response({"request_id": request_id, "status": "CANCELLED"})
    if outcome is CancelOutcome.FINISHED:
        raise ApiError(
            409,
            f"Request {request_id} has already finished.",
            param="request_id",
            code="request_finished",
            # Final: the OpenAI SDK retries a 409 (a lock timeout, to it) unless told otherwise.
            headers={"x-should-retry": "false"},
        )
    # Another user's request answers exactly like an unknown one: ids must not be probeable. The id
    # is the caller's, of any length the request line allows: cut as every echo of user input is
    # (a real id is far shorter). The 409 above names an id this edge handed out.
    raise ApiError(
        404, f"No request {request_id[:64]} in progress.", param="request_id", code="request_not_found"
    )
