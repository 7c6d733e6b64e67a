"""POST /v1/chat/completions/{request_id}/cancel: stop one of the caller's own generations.

Every call writes one `chat_cancel` line: the id it named, whose call it was, and how it ended
(`outcome`: cancelled, not_found, finished, or unavailable, the store down) and who answered
(`via`: this edge, or the fleet's store for a request on another edge). A stream's own line says
`cancelled` whether the endpoint or a client's hang-up stopped it; only this line tells the two
apart, on the edge that took the cancel.
"""

from __future__ import annotations

from typing import Any

import structlog
from litestar import Request, post
from litestar.params import FromPath
from litestar.response.base import ASGIResponse

from edge.cancel.bus import CancelBusUnavailable
from edge.cancel.outcome import CancelOutcome
from edge.errors import REQUEST_TIER, ApiError, retry_after_headers
from edge.keys.principal import Principal
from edge.log_line import info_line
from edge.openapi import ApiOperation
from edge.routes.caller import caller
from edge.routes.json_body import json_response
from edge.runtime import runtime_of

log = structlog.get_logger("floodgate.cancel")

# The id as the line names it: the caller's, of any length the request line allows, cut as every
# echo of user input is (a real id is far shorter).
_MAX_ID_CHARS = 64


def _cancel_line(
    request: Request[Any, Any, Any], request_id: str, principal: Principal, outcome: str, via: str
) -> None:
    info_line(
        log,
        "chat_cancel",
        {
            # The cancelled request's id, as its chat_completion line names it: the two join on it.
            "request_id": request_id[:_MAX_ID_CHARS],
            "user": principal.user,
            # Only a tier this edge knows, as the caller's refusal lines name it (edge/routes/caller.py).
            "tier": request.scope.get(REQUEST_TIER),
            "outcome": outcome,
            "via": via,
        },
    )


@post("/v1/chat/completions/{request_id:str}/cancel", status_code=200, operation_class=ApiOperation)
async def cancel_completion(request: Request[Any, Any, Any], request_id: FromPath[str]) -> ASGIResponse:
    runtime = runtime_of(request)
    principal = await caller(runtime, request)
    try:
        outcome, by_bus = await runtime.registry.cancel(request_id, principal.user)
    except CancelBusUnavailable:
        _cancel_line(request, request_id, principal, "unavailable", "bus")
        raise ApiError(
            503,
            "Cancellation is unavailable right now; please retry.",
            code="cancel_unavailable",
            headers=retry_after_headers(1.0),
        ) from None
    _cancel_line(request, request_id, principal, outcome, "bus" if by_bus else "local")
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
    # is the caller's: cut as the line cuts it. The 409 above names an id this edge handed out.
    raise ApiError(
        404,
        f"No request {request_id[:_MAX_ID_CHARS]} in progress.",
        param="request_id",
        code="request_not_found",
    )
