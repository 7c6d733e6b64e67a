"""Where a stream's time to first token goes inside the server: a probe for `bench.ttft_overhead --phases`.

The client's TTFT (bench/ttft_overhead.py) says how long, not where. Installed in a bench server
(bench/streams.py, when FLOODGATE_BENCH_PHASES=1), this wraps a few of the edge's own functions
and records, per request, in milliseconds:

- `total`: from the protocol's first byte of the request (uvicorn's on_message_begin) to the first
  content chunk offered to the connection (the edge's write_now);
- `begin_to_route`: from that first byte to the chat route's start (parsing, the middlewares);
- `begin_to_task`: the part of that before the request's ASGI task first runs (the head parsed,
  the task created, then every callback the loop ran before it);
- `route`: the route's own work up to its answer (auth, body, parse, `Pipeline.admit`);
- `pipeline_admit`: `Pipeline.admit` (template and tokenizer, limiter, admission);
- `limiter_admit`: the limiter's admit alone (on Redis: its round trip and the loop passes around
  it);
- `redis_reply`: on Redis, from a call's write to the read that brings its reply (admits and
  settles alike, the oldest owed on the connection): Redis's own time, its wake-up and the edge
  loop's lateness in reading; `limiter_admit` less this is the caller's code and its task's wait
  for the loop after the reply.
- `answer_to_content`: from the route's answer to the first content chunk (the response's start,
  the generation's task, the upstream's first token, the relay).

- `step`: not a request's: how long each hold of the loop by a step's delivery lasts (up to SLICE
  open streams' tokens relayed and written in one callback, edge/writes_together.py; the loop reads
  its sockets between two), what a request arriving during one waits for.

`take_requests()` returns (and forgets) each request's moments on the shared monotonic clock
(time.perf_counter is CLOCK_MONOTONIC, the same in every process of the machine), keyed by the
client's port, for `bench.ttft_overhead --phases` to join with the client's own: `[port, accepted,
begin, content]`, `accepted` (the connection's `connection_made`, the loop's accept) only for a
connection's first request. Where a slow TTFT goes outside the server (the wait for the accept, the
client's read) is then known too.

`take()` returns each phase's count, p50, p90, p99 and max, and starts afresh (GET /bench/phases).
A wrapper's own cost is a perf_counter call and a list append per phase per request. Wrapping
edge internals is the probe's business only: nothing outside bench/ imports this.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

_samples: dict[str, list[float]] = defaultdict(list)
_requests: list[tuple[int, float | None, float, float]] = []
_perf = time.perf_counter
_T0 = "floodgate.bench.t0"
_ANSWERED = "floodgate.bench.answered"
_CONTENT = b'"content":"'


def take() -> dict[str, dict[str, float]]:
    """Each phase's summary in ms since the last take, and start afresh."""
    out: dict[str, dict[str, float]] = {}
    for phase, xs in _samples.items():
        xs.sort()

        def q(p: float, xs: list[float] = xs) -> float:
            return round(xs[min(len(xs) - 1, int(p * len(xs)))] * 1e3, 3)

        out[phase] = {"n": len(xs), "p50": q(0.5), "p90": q(0.9), "p99": q(0.99), "max": q(1.0)}
    _samples.clear()
    return out


def take_requests() -> list[tuple[int, float | None, float, float]]:
    """Each request's [port, accepted, begin, content] since the last take, and start afresh."""
    out = _requests[:]
    _requests.clear()
    return out


def install() -> None:
    from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

    from edge import writes_together
    from edge.body_chunks import WRITE_NOW
    from edge.http_protocol import EdgeHttpProtocol
    from edge.pipeline import Pipeline
    from edge.routes import chat_route
    from limiter.memory import MemoryLimiter
    from limiter.redis_store import RedisLimiter
    from limiter.resp_connection import RespConnection

    begin = EdgeHttpProtocol.on_message_begin
    headers_complete = EdgeHttpProtocol.on_headers_complete

    made = EdgeHttpProtocol.connection_made

    def connection_made(self: Any, transport: Any) -> None:
        self._bench_accepted = _perf()
        peer = transport.get_extra_info("peername")
        self._bench_port = peer[1] if peer else 0
        made(self, transport)

    def on_message_begin(self: Any) -> None:
        self._bench_t0 = _perf()
        begin(self)

    def on_headers_complete(self: Any) -> None:
        headers_complete(self)
        scope = self.scope
        write_now = scope.get(WRITE_NOW)
        if write_now is None:
            return
        scope[_T0] = t0 = self._bench_t0
        seen = False
        port = self._bench_port
        # A connection's first request only: a kept connection's later ones were not accepted.
        accepted, self._bench_accepted = self._bench_accepted, None

        def first_content(body: bytes) -> bool:
            nonlocal seen
            if not seen and _CONTENT in body:
                seen = True
                now = _perf()
                _samples["total"].append(now - t0)
                _requests.append((port, accepted, t0, now))
                if _ANSWERED in scope:
                    _samples["answer_to_content"].append(now - scope[_ANSWERED])
            return bool(write_now(body))

        scope[WRITE_NOW] = first_content

    run_asgi = RequestResponseCycle.run_asgi

    async def timed_run_asgi(self: Any, app: Any) -> None:
        if _T0 in self.scope:
            _samples["begin_to_task"].append(_perf() - self.scope[_T0])
        await run_asgi(self, app)

    held = writes_together._held

    def timed_held(deliver: Any, items: Any) -> None:
        start = _perf()
        held(deliver, items)
        _samples["step"].append(_perf() - start)

    RequestResponseCycle.run_asgi = timed_run_asgi  # type: ignore[method-assign]
    writes_together._held = timed_held
    EdgeHttpProtocol.connection_made = connection_made  # type: ignore[method-assign]
    EdgeHttpProtocol.on_message_begin = on_message_begin  # type: ignore[method-assign]
    EdgeHttpProtocol.on_headers_complete = on_headers_complete  # type: ignore[method-assign]

    # The name the chat route calls (it imports answer_chat from edge/routes/chat.py).
    answer_chat = getattr(chat_route, "answer_chat")  # noqa: B009

    async def timed_answer(runtime: Any, scope: Any, receive: Any, max_bytes: int | None) -> Any:
        start = _perf()
        if _T0 in scope:
            _samples["begin_to_route"].append(start - scope[_T0])
        try:
            return await answer_chat(runtime, scope, receive, max_bytes)
        finally:
            scope[_ANSWERED] = now = _perf()
            _samples["route"].append(now - start)

    setattr(chat_route, "answer_chat", timed_answer)  # noqa: B010
    _time_method(Pipeline, "admit", "pipeline_admit")
    _time_method(RedisLimiter, "admit", "limiter_admit")
    _time_method(MemoryLimiter, "admit", "limiter_admit")

    received = RespConnection.data_received

    def timed_received(self: Any, data: bytes) -> None:
        owed = self._sent_at
        if owed:
            _samples["redis_reply"].append(time.monotonic() - owed[0])
        received(self, data)

    RespConnection.data_received = timed_received  # type: ignore[method-assign]


def _time_method(cls: type, name: str, phase: str) -> None:
    method: Callable[..., Any] = getattr(cls, name)

    async def timed(*args: Any, **kwargs: Any) -> Any:
        start = _perf()
        try:
            return await method(*args, **kwargs)
        finally:
            _samples[phase].append(_perf() - start)

    setattr(cls, name, timed)
