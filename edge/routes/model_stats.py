"""GET /v1/models/{id}/stats: how the model's replicas use their KV cache, for the playground.

Per replica: prefix-cache hit tokens and hit rate, KV blocks used / cached / free, preemptions, and
the sequences running and waiting. A public route (any valid key; the load balancer forwards
/v1/models/*), so it says only what is safe for every user to see:
* replicas are numbered in the order the edge lists them, never named: their names are Triton
  addresses or instance ids, operator internals that /metrics and /v1/internal/engine keep on the
  operator listener;
* the figures are the replica's own totals over all users, nothing of any one request or user;
* under `[admission] prefix_cache_scope = "user"`, the prefix-cache figures of a replica that pools
  every user's cache (a Triton replica) are null: its hit total grows by what a user's own guess
  found in another user's blocks, which that scope keeps from cached_tokens too
  (edge/upstreams/triton.py);
* a model the caller's tier may not use is a 404 model_not_found, as /v1/models/{id} answers.

Read from what the dispatcher's health poll last found (at most one poll interval old): no replica
is called here, so a hung replica can never hold the answer. One that has not answered a poll yet
has `figures: null`.
"""

from __future__ import annotations

from typing import Any

from litestar import Request, get
from litestar.params import FromPath
from litestar.response.base import ASGIResponse

from edge.admission.cache_figures import CacheFigures
from edge.admission.cache_scope import PrefixCacheScope
from edge.admission.replica_set import ReplicaState
from edge.openapi import ApiOperation
from edge.routes.caller import caller
from edge.routes.json_body import json_response
from edge.runtime import runtime_of
from edge.schemas import unknown_model


def _replica(number: int, state: ReplicaState, scope: PrefixCacheScope) -> dict[str, Any]:
    entry: dict[str, Any] = {"replica": number, "ready": state.alive, "figures": None}
    cap = state.capacity
    if cap is not None:
        f = CacheFigures.of(cap)
        pooled = scope == "user" and not cap.salts_prefix_cache
        entry["figures"] = {
            "running": cap.running,
            "waiting": cap.waiting,
            "prefix_cache": None
            if pooled
            else {
                "hit_tokens": f.prefix_hit_tokens,
                "query_tokens": f.prefix_query_tokens,
                "hit_rate": f.prefix_hit_rate,
            },
            "kv_blocks": {"used": f.blocks_used, "cached": f.blocks_cached, "free": f.blocks_free},
            "preemptions": f.preemptions,
        }
    return entry


@get("/v1/models/{model_id:str}/stats", operation_class=ApiOperation)
async def model_stats(request: Request[Any, Any, Any], model_id: FromPath[str]) -> ASGIResponse:
    runtime = runtime_of(request)
    principal = await caller(runtime, request)
    if model_id not in runtime.models.models_for(principal.tier):
        raise unknown_model(model_id)
    pipeline = runtime.models.pipeline_for(principal.tier, model_id)
    scope = pipeline.config.prefix_cache_scope
    states = pipeline.dispatcher.replica_states()
    replicas = [_replica(number, state, scope) for number, state in enumerate(states, start=1)]
    return json_response({"object": "model.stats", "model": model_id, "replicas": replicas})
