"""A request's own bad parameters are a 400 for that request, never a failed replica.

Regression (issue 13): `"seed": -1` reached the engine, which raised; the edge answered 502, marked
the replica suspect and retried the request on the next one, so one user repeating it took every
replica out of rotation in turn and lifted everyone's time to first token.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest

from edge.config import Settings
from edge.upstreams.base import Upstream
from edge.upstreams.local_pool import local_upstreams
from tests.edge.conftest import ROOMY_TIERS
from tests.edge.sse_client import CHAT, DONE, LONG_PROMPT, MODEL, content_of, events, find_long_seed
from tests.faults.replica_state import out_of_rotation
from tests.support.live_server import LiveServer, start_server

# Two replicas: a request the edge blamed on one would be retried on the other and blame it too.
TWO_REPLICAS = {"tiers": ROOMY_TIERS, "engine": {"replicas": 2}}
# What the replicas of the second edge can hold, below what the edge itself allows a prompt.
REPLICA_MAX_MODEL_LEN = 48


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with start_server(tmp_path_factory.mktemp("bad-input"), TWO_REPLICAS) as live:
        yield live


@pytest.fixture(scope="module")
def client(server: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.base_url, timeout=60.0, headers=server.auth("paid")) as c:
        yield c


def _ask(client: httpx.Client, **fields: Any) -> httpx.Response:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8} | fields
    return client.post(CHAT, json=body)


def test_a_negative_seed_is_a_reproducible_seed_and_blames_no_replica(
    server: LiveServer, client: httpx.Client
) -> None:
    answers = [_ask(client, seed=-1, temperature=1.0) for _ in range(6)]

    assert [a.status_code for a in answers] == [200] * 6, answers[0].text
    # -1 is a seed like any other: the same tokens every time.
    assert len({a.json()["choices"][0]["message"]["content"] for a in answers}) == 1
    assert out_of_rotation(server) == []


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("seed", 2**63),
        ("seed", -(2**63) - 1),
        ("temperature", 2.5),
        ("temperature", -0.1),
        ("top_p", -0.1),
        ("top_p", 1.5),
        ("max_tokens", 0),
        ("max_completion_tokens", 0),
        ("max_tokens", 2**63),
        ("n", 0),
        ("n", 2),
        ("presence_penalty", 2.5),
        ("frequency_penalty", -3),
        ("logit_bias", {"42": 101}),
        ("logit_bias", {"not-a-token": 1}),
        ("logit_bias", {"-1": 1}),
        ("logit_bias", {"10000000": 1}),  # past the demo model's vocabulary
        ("top_logprobs", 21),
        ("logprobs", True),
        ("stop", ["a", "b", "c", "d", "e"]),
        ("stop_token_ids", [-1]),
        ("stop_token_ids", [10000000]),  # past the demo model's vocabulary
        ("min_tokens", -1),
        ("min_tokens", 9),  # past max_tokens
    ],
)
def test_each_out_of_range_field_is_a_400_naming_it(
    server: LiveServer, client: httpx.Client, field: str, value: Any
) -> None:
    answer = _ask(client, **{field: value})

    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] is not None and re.split(r"[.\[]", error["param"])[0] == field
    assert out_of_rotation(server) == []


def test_bad_seeds_repeated_do_not_freeze_another_stream(server: LiveServer, client: httpx.Client) -> None:
    seed = find_long_seed(client, server.keys["paid"])
    long_body = {"model": MODEL, "messages": LONG_PROMPT, "seed": seed, "max_tokens": 64, "stream": True}
    refused: list[int] = []
    with client.stream("POST", CHAT, json=long_body) as stream:
        received = events(stream)
        first = next(received)
        assert first["choices"][0]["delta"]["role"] == "assistant"
        # While the stream runs, another user's bad requests: each is its own 400 or 200, no 5xx.
        with httpx.Client(base_url=server.base_url, timeout=60.0, headers=server.auth("free")) as other:
            for value in (-1, 2**64, -1, 2**70, -1):
                refused.append(_ask(other, seed=value).status_code)
        rest = list(received)

    assert refused == [200, 400, 200, 400, 200]
    chunks = [e for e in rest if isinstance(e, dict)]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert rest[-1] == DONE and content_of(chunks)
    assert out_of_rotation(server) == []


# -- the seam: an error the replica raises for the request's own parameters ------------------------


def _small_replicas(settings: Settings, model_dir: Path) -> Any:
    """The real in-process engines, built to hold fewer tokens than the edge lets a prompt have: the
    engine refuses a long prompt with its own ValueError, the way it refuses any bad parameter."""
    engine = msgspec.structs.replace(settings.engine, max_model_len=REPLICA_MAX_MODEL_LEN)

    @asynccontextmanager
    async def provide() -> AsyncIterator[list[Upstream]]:
        async with local_upstreams(msgspec.structs.replace(settings, engine=engine), model_dir) as ups:
            yield ups

    return provide()


@pytest.fixture(scope="module")
def small_replica_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with start_server(tmp_path_factory.mktemp("small-replicas"), TWO_REPLICAS, _small_replicas) as live:
        yield live


def test_a_request_the_engine_refuses_is_a_400_and_the_replicas_stay_in_rotation(
    small_replica_server: LiveServer,
) -> None:
    server = small_replica_server
    too_long = [{"role": "user", "content": "tell me a story " * 40}]
    with httpx.Client(base_url=server.base_url, timeout=60.0, headers=server.auth("paid")) as client:
        plain = client.post(CHAT, json={"model": MODEL, "messages": too_long, "max_tokens": 4})
        with client.stream(
            "POST", CHAT, json={"model": MODEL, "messages": too_long, "max_tokens": 4, "stream": True}
        ) as stream:
            streamed = list(events(stream))
        suspects = out_of_rotation(server)
        # Both replicas still take work at once (a suspect one would wait for its health check).
        fine = [_ask(client).status_code for _ in range(4)]

    assert plain.status_code == 400, plain.text
    assert plain.json()["error"]["type"] == "invalid_request_error"
    assert "refused" in plain.json()["error"]["message"]
    errors = [e["error"] for e in streamed if isinstance(e, dict) and "error" in e]
    assert len(errors) == 1 and errors[0]["type"] == "invalid_request_error"
    assert streamed[-1] == DONE
    assert suspects == []
    assert fine == [200] * 4
