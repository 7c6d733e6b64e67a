"""A checkpoint's generation_config.json through the real edge: its top_k and repetition_penalty
reach a request that omits them, as vLLM applies them (edge/models/sampling.py)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.support.live_server import LiveServer, demo_model_dir, start_server

MODEL = "gc-model"
# top_k 1: a request that omits top_k samples greedily whatever its seed and temperature. A
# repetition_penalty below 1 favours what the text already holds: the demo model's greedy reply never
# repeats a token, so one above 1 would leave it as it is, where 0.5 makes another reply of it.
GENERATION_CONFIG = {"temperature": 1.0, "top_k": 1, "repetition_penalty": 0.5}


@pytest.fixture(scope="module")
def edge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    checkpoint = tmp_path_factory.mktemp("gc") / "ckpt"
    shutil.copytree(demo_model_dir(), checkpoint)
    (checkpoint / "generation_config.json").write_text(json.dumps(GENERATION_CONFIG))
    settings = {"model": {"path": str(checkpoint), "name": MODEL}}
    with start_server(tmp_path_factory.mktemp("gc-edge"), settings) as live:
        yield live


@pytest.fixture
def sdk(edge: LiveServer) -> Iterator[openai.OpenAI]:
    client = openai.OpenAI(base_url=edge.base_url + "/v1", api_key=edge.keys["paid"], max_retries=0)
    yield client
    client.close()


def _reply(sdk: openai.OpenAI, seed: int, **extra: Any) -> str:
    completion = sdk.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Hello"}],
        max_tokens=24,
        seed=seed,
        extra_body=extra or None,
    )
    return completion.choices[0].message.content or ""


def test_top_k_and_repetition_penalty_of_the_checkpoint_apply_when_omitted(sdk: openai.OpenAI) -> None:
    omitted = [_reply(sdk, seed) for seed in (1, 2, 3)]
    # The checkpoint's values sent explicitly: the same reply, for every seed.
    explicit = _reply(sdk, 4, top_k=1, repetition_penalty=0.5)
    assert omitted == [explicit] * 3
    # Its repetition_penalty is applied too: greedy without it is another reply.
    assert _reply(sdk, 1, top_k=1, repetition_penalty=1.0) != explicit


def test_the_requests_own_values_win(sdk: openai.OpenAI) -> None:
    # top_k 0 (off) overrides the checkpoint's 1: sampling at temperature 1 again, seeds differ.
    assert len({_reply(sdk, seed, top_k=0) for seed in (1, 2, 3)}) > 1
    assert _reply(sdk, 1, repetition_penalty=1.0) == _reply(sdk, 2, top_k=1, repetition_penalty=1.0)
