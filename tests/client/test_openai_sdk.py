"""The official openai SDK works against the edge unchanged: streaming, and retrying a 429 as told."""

from __future__ import annotations

import httpx2
import openai
import pytest

from tests.client.live import LONG_REPLY
from tests.support.live_server import LiveServer


def test_the_openai_sdk_streams_from_the_edge(server: LiveServer) -> None:
    sdk = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=server.keys["paid"], max_retries=0)
    stream = sdk.chat.completions.create(
        model="floodgate-tiny",
        messages=[{"role": "user", "content": LONG_REPLY.prompt}],
        stream=True,
        max_tokens=12,
        temperature=0.0,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    assert len({chunk.id for chunk in chunks}) == 1
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes in (["stop"], ["length"])
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens <= 12
    sdk.close()


def test_the_openai_sdk_raises_rate_limit_error_without_retries(server: LiveServer) -> None:
    key = server.keys["free2"]
    patient = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=key, max_retries=5)
    impatient = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=key, max_retries=0)
    messages = [{"role": "user", "content": "hi"}]
    patient.chat.completions.create(model="floodgate-tiny", messages=messages, max_tokens=2)  # type: ignore[arg-type]
    with pytest.raises(openai.RateLimitError) as caught:
        impatient.chat.completions.create(model="floodgate-tiny", messages=messages, max_tokens=2)  # type: ignore[arg-type]
    # As OpenAI's: the code says a rate limit, the type which one.
    assert caught.value.status_code == 429 and caught.value.code == "rate_limit_exceeded"
    assert caught.value.type == "requests"
    patient.close()
    impatient.close()


def test_the_openai_sdk_retries_a_429_after_the_advertised_wait_and_succeeds(server: LiveServer) -> None:
    statuses: list[int] = []
    http = httpx2.Client(event_hooks={"response": [lambda response: statuses.append(response.status_code)]})
    sdk = openai.OpenAI(
        base_url=f"{server.base_url}/v1", api_key=server.keys["free2"], max_retries=3, http_client=http
    )
    messages = [{"role": "user", "content": LONG_REPLY.prompt}]
    sdk.chat.completions.create(model="floodgate-tiny", messages=messages, max_tokens=2)  # type: ignore[arg-type]
    statuses.clear()
    stream = sdk.chat.completions.create(
        model="floodgate-tiny",
        messages=messages,  # type: ignore[arg-type]
        max_tokens=4,
        temperature=0.0,
        stream=True,
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert statuses[0] == 429 and statuses[-1] == 200, statuses
    assert text
    sdk.close()
