"""Our import, template, tokenizer and engine give the reference implementation's greedy ids
(tests/golden/reference.py: transformers on the same GGUF), token for token."""

from __future__ import annotations

from pathlib import Path

import pytest

from edge.text.model_text import ModelText
from gpu_container.contract import GenerationRequest
from gpu_container.engine.async_engine import AsyncEngine
from gpu_container.engine.engine import LLMEngine
from gpu_container.engine.types import EngineConfig
from tests.golden.reference import CONVERSATIONS, MAX_NEW_TOKENS


def test_chat_prompts_encode_to_the_reference_ids(smollm2: Path) -> None:
    text = ModelText.load(smollm2)
    for conversation in CONVERSATIONS:
        assert text.encode_chat(conversation.messages) == conversation.prompt_ids


@pytest.mark.anyio
async def test_greedy_ids_equal_the_reference(smollm2: Path) -> None:
    engine = LLMEngine.from_pretrained(smollm2, EngineConfig(num_blocks=32, block_size=16))
    engine.start()
    try:
        generated = []
        # One at a time: batch 1, as the reference ran.
        for i, conversation in enumerate(CONVERSATIONS):
            req = GenerationRequest(
                f"golden-{i}", conversation.prompt_ids, max_new_tokens=MAX_NEW_TOKENS, temperature=0.0
            )
            ids: list[int] = []
            async for output in AsyncEngine(engine).generate(req):
                ids += output.token_ids
            generated.append(ids)
    finally:
        engine.stop()
    assert generated == [c.greedy_ids for c in CONVERSATIONS]
