"""A request the replica refuses (400) or fails before its first token (502) costs its user nothing:
not one of the tier's requests, not its prompt's tokens. OpenAI bills no 4xx or 5xx answer, and the
edge's own refusals were already refunded whole; the replica's were charged as if answered, so a
free user (a handful of requests an hour) lost one to every failure they could do nothing about."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families
from structlog.testing import capture_logs

from edge.upstreams.base import Delta, GenerationRequest, Upstream
from gpu_container.contract import UpstreamError
from limiter.base import Admission, OutputLease
from tests.edge.conftest import ROOMY_TIERS
from tests.edge.sse_client import CHAT, MODEL, wait_until
from tests.faults.test_bad_input_replica import _small_replicas
from tests.support.live_server import LiveServer, start_server
from tests.support.scripted_replicas import scripted_replicas

ONE_REQUEST = {"tiers": {"paid": ROOMY_TIERS["paid"] | {"requests_per_window": 1, "request_window_s": 3600}}}
SHORT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def test_a_request_the_replica_refuses_uses_none_of_the_users_requests(tmp_path: Path) -> None:
    too_long = SHORT | {"messages": [{"role": "user", "content": "tell me a story " * 40}]}
    with start_server(tmp_path, ONE_REQUEST, _small_replicas) as server:
        with httpx.Client(base_url=server.base_url, timeout=60.0, headers=server.auth("paid")) as client:
            refused = client.post(CHAT, json=too_long)
            answered = client.post(CHAT, json=SHORT)
    assert refused.status_code == 400, refused.text
    assert "refused" in refused.json()["error"]["message"]
    assert answered.status_code == 200, answered.text  # the tier's one request was still there
    assert answered.headers["x-ratelimit-remaining-requests"] == "0"


FAIL_AT_ONCE, FAIL_AFTER_3 = 8, 9


async def _failing(inner: Upstream, req: GenerationRequest) -> AsyncIterator[Delta]:
    """A generation asking for FAIL_AT_ONCE tokens fails before its first (its connection reset
    mid-prefill), and one asking for FAIL_AFTER_3 fails after three."""
    if req.max_new_tokens == FAIL_AT_ONCE:
        raise UpstreamError("connection reset by the replica")
    tokens = 0
    async for delta in inner.generate(req):
        if req.max_new_tokens == FAIL_AFTER_3:
            # Exactly three, whichever way the engine merged its deltas (a busy machine hands
            # several tokens over at once, up to the whole reply with its finish: the fresh-clone
            # CI's stream then ended without its error once), and never an end.
            delta = replace(delta, token_ids=delta.token_ids[: 3 - tokens], finish_reason=None)
            tokens += len(delta.token_ids)
            yield delta
            if tokens >= 3:
                raise UpstreamError("connection reset by the replica")
            continue
        tokens += len(delta.token_ids)
        yield delta


_failing_replicas = scripted_replicas(_failing)


def test_a_request_the_replica_fails_before_its_first_token_uses_none_of_the_users_requests(
    tmp_path: Path,
) -> None:
    failing = SHORT | {"max_tokens": FAIL_AT_ONCE}
    with start_server(tmp_path, ONE_REQUEST, _failing_replicas) as server:
        with httpx.Client(base_url=server.base_url, timeout=60.0, headers=server.auth("paid")) as client:
            failed, answered = client.post(CHAT, json=failing), client.post(CHAT, json=SHORT)
    assert failed.status_code == 502, failed.text
    assert failed.json()["error"]["code"] == "upstream_error"
    assert answered.status_code == 200, answered.text  # the tier's one request was still there


def test_a_second_replica_failing_the_retry_is_a_failed_replica_not_a_generation_that_ran(
    tmp_path: Path,
) -> None:
    """A request whose first replica fails before its first token is retried once elsewhere; when
    that one fails before its first token too, its slot was given back as a generation that ran
    (a helper's review): the replica stayed placeable until the next health check, its service
    rate learnt the failure's duration, and the fair queue learnt that this user's replies are 0
    tokens long (the first sample replaces the prior), pricing its next requests at their prompt
    alone. Read from what is learnt, which no health check undoes."""
    two = {"engine": {"replicas": 2, "isolation": "thread"}}
    with start_server(tmp_path, two, _failing_replicas) as server:
        dispatcher = server.app.state.runtime.pipeline.dispatcher
        with httpx.Client(base_url=server.base_url, timeout=60.0, headers=server.auth("paid")) as client:
            failed = client.post(CHAT, json=SHORT | {"max_tokens": FAIL_AT_ONCE})
        assert failed.status_code == 502, failed.text
        assert [r.rate.samples for r in dispatcher.replicas.members] == [0, 0]
        assert dict(dispatcher._reply_lengths._by_user) == {}


# Token windows so long that nothing refills within the test: what the limiter holds spent moves
# only by what requests are charged.
NO_REFILL = {"tiers": {"paid": ROOMY_TIERS["paid"] | {"token_window_s": 1e9, "tokens_per_window": 100_000}}}


def test_an_answer_not_streamed_that_fails_after_tokens_costs_nothing_and_a_stream_pays_what_it_got(
    tmp_path: Path,
) -> None:
    """Not streamed, the client gets the 502 alone, whatever the replica generated before failing;
    streamed, it got those tokens' text, and pays for them."""

    def remaining(answer: httpx.Response) -> int:
        assert answer.status_code == 200, answer.text
        return int(answer.headers["x-ratelimit-remaining-tokens"])

    failing = SHORT | {"max_tokens": FAIL_AFTER_3}
    with start_server(tmp_path, NO_REFILL, _failing_replicas) as server:
        with httpx.Client(base_url=server.base_url, timeout=60.0, headers=server.auth("paid")) as client:
            before = client.post(CHAT, json=SHORT)
            failed = client.post(CHAT, json=failing)
            after = client.post(CHAT, json=SHORT)
            with client.stream(
                "POST", CHAT, json=failing | {"stream": True, "stream_options": {"include_usage": True}}
            ) as streamed:
                got = [line for line in streamed.iter_lines() if line.startswith("data: {")]
            last = client.post(CHAT, json=SHORT)
    assert failed.status_code == 502, failed.text
    # An answer's remaining count is after its own usage: between two of them, the later one's cost
    # (its reply is sampled, up to 4 tokens, and may end sooner or later than the earlier one's) and
    # nothing of the failure.
    assert remaining(before) - remaining(after) == after.json()["usage"]["total_tokens"]
    # The stream carried its three tokens' text before its error, and they were charged with its prompt.
    assert streamed.status_code == 200 and '"error"' in got[-1]
    stream_cost = before.json()["usage"]["prompt_tokens"] + 3
    assert remaining(after) - remaining(last) == last.json()["usage"]["total_tokens"] + stream_cost
    # Asked for, the usage chunk says so, just before the error (the SDKs raise at the error and
    # read nothing after): a client billing its own users by `usage` counts what it was charged.
    usage = json.loads(got[-2].removeprefix("data: "))["usage"]
    prompt = before.json()["usage"]["prompt_tokens"]
    assert (usage["prompt_tokens"], usage["completion_tokens"], usage["total_tokens"]) == (
        prompt,
        3,
        stream_cost,
    )


class _CancelledElsewhere:
    """A limiter whose settle answers that a cancel sent to another edge instance came first, as
    the Redis store answers when the fleet's cancel reached the store before this end (a stand-in:
    two edges cannot be made to race so on cue)."""

    def __init__(self, real: Any) -> None:
        self._real = real

    async def admit(self, *args: Any, **kwargs: Any) -> Admission:
        admission: Admission = await self._real.admit(*args, **kwargs)
        if admission.lease is None:
            return admission
        return Admission(admission.decision, _SettledAsCancelled(admission.lease))

    async def aclose(self) -> None:
        await self._real.aclose()


class _SettledAsCancelled:
    def __init__(self, lease: OutputLease) -> None:
        self._lease = lease

    def try_take(self, n: int) -> int | None:
        return self._lease.try_take(n)

    async def take(self, n: int) -> int:
        return await self._lease.take(n)

    def give_back(self, n: int) -> None:
        self._lease.give_back(n)

    @property
    def charged(self) -> int:
        return self._lease.charged

    async def settle(self, *, ran: bool = True, cancelled: bool = False) -> bool | None:
        await self._lease.settle(ran=ran, cancelled=cancelled)
        return True


def test_a_failed_answer_refunded_keeps_its_error_when_a_cancel_elsewhere_came_first(tmp_path: Path) -> None:
    """A review: the refunded request was turned into the cancelled reply, 200 with the text the
    replica made before failing, and that text cost nothing."""
    failing = SHORT | {"max_tokens": FAIL_AFTER_3}
    with start_server(tmp_path, NO_REFILL, _failing_replicas) as server:
        with httpx.Client(base_url=server.base_url, timeout=60.0, headers=server.auth("paid")) as client:
            before = client.post(CHAT, json=SHORT)
            pipeline = server.app.state.runtime.pipeline
            real, pipeline.limiter = pipeline.limiter, _CancelledElsewhere(pipeline.limiter)
            raced = client.post(CHAT, json=failing)
            pipeline.limiter = real
            after = client.post(CHAT, json=SHORT)
    assert raced.status_code == 502, raced.text
    assert (
        int(before.headers["x-ratelimit-remaining-tokens"])
        - int(after.headers["x-ratelimit-remaining-tokens"])
        == after.json()["usage"]["total_tokens"]  # its own usage is in its count; the failure's none
    )


def test_an_answer_not_streamed_that_fails_after_tokens_stores_nothing_in_the_history(
    tmp_path: Path,
) -> None:
    """Its question and partial reply were stored though the client got the 502 alone: its retry,
    as the 502 invites, left the question twice in the history and a reply the client never saw
    (a review)."""
    ask = SHORT | {"conversation_id": "conv-failed"}
    url = "/v1/conversations/conv-failed/messages"
    with start_server(tmp_path, NO_REFILL, _failing_replicas) as server:
        with httpx.Client(base_url=server.base_url, timeout=60.0, headers=server.auth("paid")) as client:
            failed = client.post(CHAT, json=ask | {"max_tokens": FAIL_AFTER_3})
            retried = client.post(CHAT, json=ask)
            assert failed.status_code == 502 and retried.status_code == 200, retried.text

            def stored() -> list[tuple[str, str]]:
                answer = client.get(url)
                return (
                    [(m["role"], m["request_id"]) for m in answer.json()["data"]] if answer.is_success else []
                )

            rid = retried.json()["id"]
            wait_until(lambda: ("assistant", rid) in stored(), what="the retry's turns to be stored")
            assert stored() == [("user", rid), ("assistant", rid)]


def _turns(client: httpx.Client, cid: str) -> list[tuple[str, str]]:
    answer = client.get(f"/v1/conversations/{cid}/messages")
    return [(m["role"], m["request_id"]) for m in answer.json()["data"]] if answer.is_success else []


def test_a_stream_failed_before_its_first_token_stores_no_turn(tmp_path: Path) -> None:
    """Streamed, a request whose replica fails before its first token gets an error event alone and
    is refunded whole; its question was stored when it reached the replica, with an empty reply
    finished "error", and the client's retry stored the question again (a review). The question is
    stored at the first token now: the history holds the retry's two turns alone."""
    ask = SHORT | {"conversation_id": "conv-502", "stream": True}
    with start_server(tmp_path, NO_REFILL, _failing_replicas) as server:
        with httpx.Client(base_url=server.base_url, timeout=60.0, headers=server.auth("paid")) as client:
            with client.stream("POST", CHAT, json=ask | {"max_tokens": FAIL_AT_ONCE}) as failed:
                events = [line for line in failed.iter_lines() if line.startswith("data: ")]
            assert "upstream_error" in events[-2], events
            with client.stream("POST", CHAT, json=ask) as retried:
                list(retried.iter_lines())
                rid = retried.headers["x-request-id"]
            wait_until(lambda: ("assistant", rid) in _turns(client, "conv-502"), what="the retry's turns")
            assert _turns(client, "conv-502") == [("user", rid), ("assistant", rid)]


def test_a_stream_the_replica_refuses_stores_no_turn(tmp_path: Path) -> None:
    """The replica's 400, streamed (an error event alone, refunded whole), left the question and an
    empty reply finished "rejected" (a review)."""
    refused = {
        "model": MODEL,
        "max_tokens": 4,
        "stream": True,
        "conversation_id": "conv-400",
        "messages": [{"role": "user", "content": "tell me a story " * 40}],
    }
    with start_server(tmp_path, NO_REFILL, _small_replicas) as server:
        with httpx.Client(base_url=server.base_url, timeout=60.0, headers=server.auth("paid")) as client:
            with client.stream("POST", CHAT, json=refused) as answer:
                events = [line for line in answer.iter_lines() if line.startswith("data: ")]
            assert '"error"' in events[-2], events
            marker = SHORT | {"conversation_id": "conv-400-marker"}
            assert client.post(CHAT, json=marker).status_code == 200
            wait_until(lambda: len(_turns(client, "conv-400-marker")) == 2, what="the marker's turns")
            assert _turns(client, "conv-400") == []


def test_the_log_line_counts_what_the_request_was_charged(tmp_path: Path) -> None:
    """The `chat_completion` line's prompt_tokens and completion_tokens are what the user was
    charged, as the usage object, the limiter and /v1/usage count them. A request refunded whole
    (its 502 alone, not streamed, after the replica made three tokens; a failure before its first
    token) logged its prompt and those tokens all the same: a bill reconciled from the logs
    charged for answers the client never got (a review). What the replica made is still there,
    as generated_tokens."""
    failing = SHORT | {"max_tokens": FAIL_AFTER_3}
    with start_server(tmp_path, NO_REFILL, _failing_replicas) as server:
        with httpx.Client(base_url=server.base_url, timeout=60.0, headers=server.auth("paid")) as client:
            prompt = client.post(CHAT, json=SHORT).json()["usage"]["prompt_tokens"]
            # The line is written before the answer goes out (Generation.close): no wait needed.
            with capture_logs() as logs:
                after_3 = client.post(CHAT, json=failing)
                at_once = client.post(CHAT, json=SHORT | {"max_tokens": FAIL_AT_ONCE})
                with client.stream(
                    "POST", CHAT, json=failing | {"stream": True, "stream_options": {"include_usage": True}}
                ) as streamed:
                    got = [line for line in streamed.iter_lines() if line.startswith("data: {")]
    assert after_3.status_code == 502 and at_once.status_code == 502, (after_3.text, at_once.text)
    usage = json.loads(got[-2].removeprefix("data: "))["usage"]
    lines = [
        (line["stream"], line["prompt_tokens"], line["completion_tokens"], line.get("generated_tokens"))
        for line in logs
        if line["event"] == "chat_completion"
    ]
    assert lines == [(False, 0, 0, 3), (False, 0, 0, 0), (True, prompt, 3, 3)], lines
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (prompt, 3)


def _counted(server: LiveServer, name: str, **labels: str) -> float:
    """`name`'s samples on the edge's /metrics page with `labels` among theirs, summed (over the
    models it serves, say)."""
    return sum(
        sample.value
        for family in text_string_to_metric_families(server.metrics_text())
        for sample in family.samples
        if sample.name == name and labels.items() <= sample.labels.items()
    )


def _token_counters(server: LiveServer) -> tuple[float, float]:
    return (
        _counted(server, "floodgate_prompt_tokens_total", tier="paid"),
        _counted(server, "floodgate_generation_tokens_total", tier="paid"),
    )


def test_the_token_counters_count_what_the_request_was_charged(tmp_path: Path) -> None:
    """floodgate_prompt_tokens_total and floodgate_generation_tokens_total count the tokens users
    are charged, as `usage` and the limiter do. A request refunded whole (its 502 alone, not
    streamed, after the replica made three tokens; a failure before its first token) counted its
    prompt at admission and those three tokens all the same: the served tokens a dashboard showed
    were more than anyone paid for (a review)."""
    failing = SHORT | {"max_tokens": FAIL_AFTER_3}
    with start_server(tmp_path, NO_REFILL, _failing_replicas) as server:
        with httpx.Client(base_url=server.base_url, timeout=60.0, headers=server.auth("paid")) as client:
            # The counters are the process's: other servers' requests may be in them already.
            before = _token_counters(server)
            after_3 = client.post(CHAT, json=failing)
            at_once = client.post(CHAT, json=SHORT | {"max_tokens": FAIL_AT_ONCE})
            refunded = _token_counters(server)
            with client.stream(
                "POST", CHAT, json=failing | {"stream": True, "stream_options": {"include_usage": True}}
            ) as streamed:
                got = [line for line in streamed.iter_lines() if line.startswith("data: {")]
            charged = _token_counters(server)
    assert after_3.status_code == 502 and at_once.status_code == 502, (after_3.text, at_once.text)
    assert refunded == before
    usage = json.loads(got[-2].removeprefix("data: "))["usage"]
    assert (charged[0] - refunded[0], charged[1] - refunded[1]) == (usage["prompt_tokens"], 3)


def test_an_answer_not_streamed_that_fails_is_counted_once_as_finished_and_not_as_rejected(
    tmp_path: Path,
) -> None:
    """An admitted request's end is counted in floodgate_requests_finished_total, with its reason;
    not streamed, its 502 was counted in floodgate_requests_rejected_total too, so a dashboard
    adding the two saw every such failure twice (a review). A stream's failure, an event in a
    200, was only ever counted as finished; a refusal before admission, only as rejected."""
    with start_server(tmp_path, NO_REFILL, _failing_replicas) as server:
        with httpx.Client(base_url=server.base_url, timeout=60.0, headers=server.auth("paid")) as client:
            finished = _counted(server, "floodgate_requests_finished_total", tier="paid", reason="error")
            rejected = server.rejected(502)
            failed = client.post(CHAT, json=SHORT | {"max_tokens": FAIL_AT_ONCE})
            assert failed.status_code == 502, failed.text
            assert (
                _counted(server, "floodgate_requests_finished_total", tier="paid", reason="error")
                == finished + 1
            )
            assert server.rejected(502) == rejected
