"""429s: the typed error with the advertised wait, and auto_retry admitted once that wait is over.

The free tier here allows one request per second per user (tests/client/live.py).
"""

from __future__ import annotations

import pytest

from floodgate_client import AsyncClient, Client, RateLimitError
from tests.support.live_server import LiveServer


def test_a_refused_request_raises_rate_limit_error_and_auto_retry_is_admitted(server: LiveServer) -> None:
    with Client(server.base_url, server.keys["free"], max_retries=3) as client:
        # Whatever an earlier test left in this user's window, this one gets in (waiting if need be).
        client.chat.create("first", max_tokens=2, auto_retry=True, deadline_s=10)
        with pytest.raises(RateLimitError) as caught:
            client.chat.stream("second, at once", max_tokens=2)
        refused = caught.value
        assert refused.status_code == 429 and refused.limit == "requests"
        assert (refused.type, refused.code) == ("requests", "rate_limit_exceeded")  # OpenAI's shape
        assert refused.retry_after_s is not None and 0 < refused.retry_after_s <= 1.0
        assert refused.headers["retry-after"] == "1"
        assert refused.rate_limits.limit_requests == 1 and refused.rate_limits.remaining_requests == 0

        result = client.chat.create("third, retrying", max_tokens=2, auto_retry=True, deadline_s=10)
    assert result.request_id and result.finish_reason in ("stop", "length")


def test_auto_retry_gives_up_when_the_wait_would_pass_the_deadline(server: LiveServer) -> None:
    with Client(server.base_url, server.keys["free"], max_retries=3) as client:
        client.chat.create("first", max_tokens=2, auto_retry=True, deadline_s=10)
        with pytest.raises(RateLimitError):
            client.chat.create("no time to wait", max_tokens=2, auto_retry=True, deadline_s=0.01)


@pytest.mark.anyio
async def test_async_auto_retry_is_admitted_after_the_advertised_wait(server: LiveServer) -> None:
    async with AsyncClient(server.base_url, server.keys["free"], max_retries=3) as client:
        await client.chat.create("first", max_tokens=2, auto_retry=True, deadline_s=10)
        with pytest.raises(RateLimitError):
            await client.chat.stream("second, at once", max_tokens=2)
        result = await client.chat.create("third, retrying", max_tokens=2, auto_retry=True, deadline_s=10)
    assert result.request_id
