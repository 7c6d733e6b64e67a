"""Header parsing and the retry decision: pure functions, checked on the edge's own header formats."""

from __future__ import annotations

import time
from collections.abc import Iterator
from email.utils import formatdate

import pytest

from floodgate_client.decoder import stream_error
from floodgate_client.errors import BadRequestError, RateLimitError, error_from_response, retry_after_s
from floodgate_client.rate_limits import RateLimits, parse_duration_s
from floodgate_client.retry import RetryPolicy


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("20ms", 0.02),
        ("1s", 1.0),
        ("1.5s", 1.5),
        ("6m0s", 360.0),
        ("1h2m3s", 3723.0),
        ("0s", 0.0),
        ("2.5", 2.5),
    ],
)
def test_reset_durations_in_openai_format_parse_to_seconds(text: str, seconds: float) -> None:
    assert parse_duration_s(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "soon", "1x", "s1", "1s junk"])
def test_unparseable_durations_are_none(text: str) -> None:
    assert parse_duration_s(text) is None


def test_rate_limits_read_every_header_and_tolerate_missing_ones() -> None:
    limits = RateLimits.from_headers(
        {
            "X-RateLimit-Limit-Requests": "20",
            "x-ratelimit-remaining-requests": "19",
            "x-ratelimit-reset-requests": "9m0s",
            "x-ratelimit-limit-tokens": "40000",
        }
    )
    assert limits == RateLimits(20, 19, 540.0, 40000, None, None)


def test_retry_after_prefers_milliseconds_then_seconds() -> None:
    assert retry_after_s({"Retry-After": "2", "retry-after-ms": "1250"}) == pytest.approx(1.25)
    assert retry_after_s({"retry-after": "3"}) == pytest.approx(3.0)
    assert retry_after_s({}) is None


@pytest.mark.parametrize(
    "headers",
    [
        *(
            {"retry-after": text}
            for text in ("inf", "Infinity", "-inf", "1e400", "nan", "1e300", "4e9", "1e10")
        ),
        {"retry-after": "Fri, 31 Dec 9999 23:59:59 GMT"},
        *({"retry-after-ms": text} for text in ("inf", "nan", "1e400", "1" + "0" * 400, "4e12")),
    ],
)
def test_a_wait_no_sleep_can_take_is_no_hint(headers: dict[str, str]) -> None:
    """A review: `Retry-After: inf` (or 1e400, or a wait of centuries, a date in year 9999) was an
    infinite or absurd retry_after_s, and NaN a wait of 0; auto_retry gave up, but a caller's own
    time.sleep(error.retry_after_s) raised OverflowError. As an error event's unholdable wait (no
    hint), the answer is raised with none and a retry backs off as it does without one."""
    assert retry_after_s(headers) is None
    refused = error_from_response(429, headers, b"{}")
    assert refused.retry_after_s is None
    wait = RetryPolicy(max_retries=2, deadline_s=60.0).wait_s(refused, retries_done=0, elapsed_s=0.0)
    assert wait is not None and 0.5 <= wait <= 0.55  # the first backoff, jitter on top


def test_an_unholdable_wait_in_milliseconds_leaves_the_seconds_and_a_real_wait_is_kept() -> None:
    assert retry_after_s({"retry-after-ms": "inf", "retry-after": "3"}) == pytest.approx(3.0)
    assert retry_after_s({"retry-after": "-5"}) == 0.0  # a wait already over: none, as before
    a_year = 365 * 86400
    assert retry_after_s({"retry-after": str(a_year)}) == a_year  # a yearly budget's refill
    # An error event's finite but absurd wait reaches the same reading (its headers).
    event = {"error": {"message": "restarting", "code": "upstream_error", "retry_after_ms": 1e300}}
    assert stream_error(event, None).retry_after_s is None


@pytest.fixture
def far_from_utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A local zone hours from UTC, so a date read as local time is off by hours."""
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


@pytest.mark.usefixtures("far_from_utc")
def test_retry_after_http_dates_are_gmt_in_every_form() -> None:
    when = time.time() + 30
    forms = [
        formatdate(when, usegmt=True),  # IMF-fixdate: Sun, 06 Nov 1994 08:49:37 GMT
        time.asctime(time.gmtime(when)),  # asctime: Sun Nov  6 08:49:37 1994
        formatdate(when).replace("+0000", "-0000"),
    ]
    for form in forms:
        wait = retry_after_s({"retry-after": form})
        assert wait is not None and 25.0 <= wait <= 31.0, form


def test_error_bodies_become_typed_errors_with_their_fields() -> None:
    body = b'{"error":{"message":"slow down","type":"tokens","param":null,"code":"rate_limit_exceeded"}}'
    error = error_from_response(429, {"retry-after-ms": "500"}, body)
    assert isinstance(error, RateLimitError)
    assert (error.limit, error.retry_after_s, error.code) == ("tokens", 0.5, "rate_limit_exceeded")
    # An overload names its reason as the code.
    body = b'{"error":{"message":"busy","type":"rate_limit_exceeded","param":null,"code":"queue_full"}}'
    assert error_from_response(429, {}, body).limit == "queue_full"
    assert isinstance(error_from_response(413, {}, b"too large"), BadRequestError)


def test_retry_waits_at_least_the_advertised_time_and_gives_up_past_the_deadline() -> None:
    refused = error_from_response(429, {"retry-after-ms": "800"}, b"{}")
    policy = RetryPolicy(max_retries=2, deadline_s=5.0)
    wait = policy.wait_s(refused, retries_done=0, elapsed_s=0.0)
    assert wait is not None and 0.8 <= wait <= 0.88
    assert policy.wait_s(refused, retries_done=2, elapsed_s=0.0) is None
    assert policy.wait_s(refused, retries_done=0, elapsed_s=4.5) is None
    assert policy.wait_s(error_from_response(400, {}, b"{}"), retries_done=0, elapsed_s=0.0) is None
    # The edge marks a wait of minutes final for the SDKs, which would retry it at once: this client
    # waits it out whole where its caller's deadline allows.
    far = error_from_response(429, {"retry-after": "540", "x-should-retry": "false"}, b"{}")
    assert RetryPolicy(max_retries=2, deadline_s=600.0).wait_s(far, retries_done=0, elapsed_s=0.0)
