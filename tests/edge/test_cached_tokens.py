"""usage.prompt_tokens_details.cached_tokens: the prompt tokens the replica served from its prefix
cache, as OpenAI and vLLM report them, read by the official openai SDK."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from edge.upstreams.triton import triton_upstreams
from tests.edge.conftest import EDGE_SETTINGS
from tests.edge.sse_client import MODEL
from tests.support.live_server import LiveServer, start_server
from tests.support.triton_server import ENGINE_CONFIG, LocalTriton

# Long enough to fill several KV blocks; unique per run, so no earlier request of the shared
# server has cached it.
SYSTEM = "You answer questions about rivers, lakes and the sea, briefly and kindly. " * 4


def _sdk(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key=server.keys["paid"], max_retries=0)


@pytest.fixture
def local_sdk(local_server: LiveServer) -> Iterator[openai.OpenAI]:
    client = _sdk(local_server)
    yield client
    client.close()


@pytest.fixture
def triton_sdk(tmp_path: Path, local_triton: LocalTriton) -> Iterator[openai.OpenAI]:
    """An edge on the session's Triton whose users share the prefix cache: a Triton replica reports
    its hits only then (under the default "user" scope it cannot keep them to one user, and reports
    0: edge/upstreams/triton.py)."""
    shared = {**EDGE_SETTINGS, "admission": {"prefix_cache_scope": "shared"}}
    with start_server(tmp_path, shared, triton_upstreams(local_triton.spec)) as live:
        client = _sdk(live)
        yield client
        client.close()


def _messages(system: str, question: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": system}, {"role": "user", "content": question}]


def test_a_shared_prefix_is_reported_cached_in_both_modes(
    local_server: LiveServer, local_sdk: openai.OpenAI
) -> None:
    system = f"{uuid.uuid4().hex} {SYSTEM}"
    first = local_sdk.chat.completions.create(
        model=MODEL, messages=_messages(system, "Where do rivers start?"), max_tokens=4
    )
    assert first.usage is not None and first.usage.prompt_tokens_details is not None
    cold = first.usage.prompt_tokens_details.cached_tokens
    assert cold is not None

    again = local_sdk.chat.completions.create(
        model=MODEL, messages=_messages(system, "Why is the sea salty?"), max_tokens=4
    )
    assert again.usage is not None and again.usage.prompt_tokens_details is not None
    cached = again.usage.prompt_tokens_details.cached_tokens
    block = local_server.settings.engine.block_size
    assert cached is not None and cached > cold
    assert cached % block == 0 and cached < again.usage.prompt_tokens

    stream = local_sdk.chat.completions.create(
        model=MODEL,
        messages=_messages(system, "What feeds a lake?"),
        max_tokens=4,
        stream=True,
        stream_options={"include_usage": True},
    )
    usage = list(stream)[-1].usage
    assert usage is not None and usage.prompt_tokens_details is not None
    # The same shared prefix, found again (at least the blocks the second request found).
    streamed = usage.prompt_tokens_details.cached_tokens
    assert streamed is not None and streamed >= cached and streamed % block == 0


def _cached(sdk: openai.OpenAI, system: str, question: str) -> tuple[int, int]:
    """(cached_tokens, prompt_tokens) of one completion, as the official SDK parses them."""
    completion = sdk.chat.completions.create(model=MODEL, messages=_messages(system, question), max_tokens=4)
    usage = completion.usage
    assert usage is not None and usage.prompt_tokens_details is not None
    cached = usage.prompt_tokens_details.cached_tokens
    assert cached is not None
    return cached, usage.prompt_tokens


def test_the_triton_path_reports_what_the_in_process_path_reports(
    local_sdk: openai.OpenAI, triton_sdk: openai.OpenAI
) -> None:
    """TensorRT-LLM's kv_cache_reused_blocks x the replica's block size, on the same requests."""
    system = f"{uuid.uuid4().hex} {SYSTEM}"
    questions = ("Where do rivers start?", "Why is the sea salty?")
    via_triton = [_cached(triton_sdk, system, q) for q in questions]
    via_local = [_cached(local_sdk, system, q) for q in questions]
    assert via_triton == via_local
    (_, _), (cached, prompt_tokens) = via_triton
    block = ENGINE_CONFIG.block_size  # the replica's own (tests/support/triton_server.py)
    assert 0 < cached < prompt_tokens and cached % block == 0
