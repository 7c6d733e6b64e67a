"""When to try a refused request again: after the server's advertised wait, within a total deadline."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass

import anyio

from floodgate_client.errors import FloodgateError

# Answers the OpenAI SDK sends again (its _should_retry): a request timeout, a lock timeout, a rate
# limit, and every server error (a replica restarting, a proxy's 502 or 504), which a later try may
# find healed. A 4xx besides these is the request's own fault and would come again.
_RETRIED_STATUSES = frozenset({408, 409, 429})
_SERVER_ERRORS = 500
# The OpenAI SDK's name for the retries a request has taken; the edge reads it (edge/retry_count.py).
RETRY_COUNT_HEADER = "x-stainless-retry-count"
# Without an advertised wait, back off exponentially from this, up to the cap.
_BASE_BACKOFF_S = 0.5
_MAX_BACKOFF_S = 8.0
# Retrying early only earns another 429, so jitter is added on top of the advertised wait, never
# taken off it: a little (10%, at most a second) spreads out clients that were refused together.
_JITTER_FRACTION = 0.1
_MAX_JITTER_S = 1.0
# A network failure advises no wait: the backoff above, less up to this fraction, as the OpenAI SDK
# draws it (_calculate_retry_timeout). Sent again at once, every client of an edge that is
# restarting (or of a load balancer with no healthy target) came back in the same instant, and its
# one retry was spent before anything could have healed.
_NETWORK_JITTER_FRACTION = 0.25
# A wait before another attempt looks this often whether the stream was closed (or its retry called
# off by a cancel) meanwhile: the reader then ends at once, not when a refusal's wait (up to a
# minute) is over.
_CLOSED_POLL_S = 0.05


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    max_retries: int
    deadline_s: float

    def wait_s(self, error: FloodgateError, retries_done: int, elapsed_s: float) -> float | None:
        """Seconds to wait before the next attempt, or None: give up and raise `error`."""
        if not retryable(error):
            return None
        if retries_done >= self.max_retries:
            return None
        advertised = error.retry_after_s
        if advertised is None:
            advertised = backoff_s(retries_done)
        wait = advertised + random.uniform(0.0, min(_MAX_JITTER_S, advertised * _JITTER_FRACTION))
        if elapsed_s + wait > self.deadline_s:
            return None
        return wait

    def network_wait_s(
        self, retries_done: int, elapsed_s: float, draw: Callable[[], float] = random.random
    ) -> float | None:
        """Seconds to wait before sending again after a network failure before the answer's head,
        the request's `retries_done` retries taken, or None: the deadline would pass first. `draw`
        gives the jitter, in [0, 1)."""
        wait = backoff_s(retries_done) * (1.0 - _NETWORK_JITTER_FRACTION * draw())
        if elapsed_s + wait > self.deadline_s:
            return None
        return wait


def backoff_s(retries_done: int) -> float:
    """The wait before a retry that no answer advised one for: 0.5 s doubling, at most 8 s."""
    # The exponent is capped so that no count of retries overflows the float.
    return min(_MAX_BACKOFF_S, _BASE_BACKOFF_S * 2.0 ** min(retries_done, 32))


def retryable(error: FloodgateError) -> bool:
    """Whether another try may be answered otherwise, decided as the OpenAI SDK decides: the
    server's `x-should-retry` first (the edge says "false" on a 502 whose request may be what
    killed its replica: sent again it would kill the next), then the status. A "false" beside an
    advised wait is left to that wait and the deadline: the edge marks a wait of minutes final for
    the SDKs, which ignore such a wait and retry at once, where this client waits it out whole. An
    error with no status (an error event after the stream had started, a broken connection) is not
    one of these: what the stream delivered cannot be taken back, and a network failure before the
    answer's head has its own single retry."""
    should_retry = error.headers.get("x-should-retry")
    if should_retry == "true":
        return True
    if should_retry == "false" and error.retry_after_s is None:
        return False
    status = error.status_code
    return status is not None and (status in _RETRIED_STATUSES or status >= _SERVER_ERRORS)


@dataclass(slots=True)
class Attempts:
    """What one streamed request may still spend on trying again, across every attempt it makes:
    refusals waited out (`policy`: max_retries within deadline_s, counted from the first attempt)
    and sends again after a network failure before the answer's head (`network_retries`). Each
    reopened attempt once started a count and a clock of its own: max_retries=2 with deadline_s=5
    sent 6 requests over 6.6 s when the edge refused in the stream."""

    policy: RetryPolicy
    network_retries: int
    # Set by the first attempt (`begin`), not when this is made: an async stream is made before it is
    # sent, and the time its caller took to open it was counted against its deadline (a short 429
    # raised at once, never waited out, once a deadline's worth had gone by).
    started: float | None = None
    refusals_waited: int = 0
    # Set when the stream is closed: no attempt starts after, whatever it was waiting on.
    closed: bool = False
    # Attempts sent so far (`begin`).
    sent: int = 0

    def begin(self) -> dict[str, str]:
        """An attempt goes out: the first one starts the deadline's clock. Returns its headers:
        the retries taken before it, as the OpenAI SDK sends them (`x-stainless-retry-count`), so
        that the edge counts a retry it refuses again as no new demand (edge/retry_count.py)."""
        if self.started is None:
            self.started = time.monotonic()
        self.sent += 1
        return {RETRY_COUNT_HEADER: str(self.sent - 1)}

    def refusal_wait_s(self, error: FloodgateError) -> float | None:
        """Seconds to wait before trying `error`'s request again, or None: give up."""
        elapsed_s = 0.0 if self.started is None else time.monotonic() - self.started
        wait = self.policy.wait_s(error, self.refusals_waited, elapsed_s)
        if wait is not None:
            self.refusals_waited += 1
        return wait

    def pause(self, seconds: float) -> None:
        """Wait `seconds` before the next attempt, or less once the stream is closed."""
        end = time.monotonic() + seconds
        while not self.closed and (left := end - time.monotonic()) > 0:
            time.sleep(min(left, _CLOSED_POLL_S))

    async def apause(self, seconds: float) -> None:
        """`pause` on the event loop."""
        end = anyio.current_time() + seconds
        while not self.closed and (left := end - anyio.current_time()) > 0:  # noqa: ASYNC110 (a flag)
            await anyio.sleep(min(left, _CLOSED_POLL_S))

    def network_retry_wait_s(self) -> float | None:
        """After a network failure before the answer's head: seconds to wait before sending again,
        growing with the retries this request has taken (refusals too), or None: none is left, or
        the deadline would pass first."""
        if self.network_retries <= 0:
            return None
        elapsed_s = 0.0 if self.started is None else time.monotonic() - self.started
        wait = self.policy.network_wait_s(max(0, self.sent - 1), elapsed_s)
        if wait is not None:
            self.network_retries -= 1
        return wait
