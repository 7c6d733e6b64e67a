"""Build the demo checkpoint, load it the way a real one is loaded, and generate through asyncio."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from gpu_container.contract import GenerationRequest
from gpu_container.engine.async_engine import AsyncEngine
from gpu_container.engine.engine import LLMEngine
from gpu_container.engine.types import EngineConfig


@pytest.mark.anyio
async def test_demo_checkpoint_loads_and_generates(demo_dir: Path) -> None:
    tokenizer = Tokenizer.from_file(str(demo_dir / "tokenizer.json"))
    config = json.loads((demo_dir / "config.json").read_text())
    prompt = tokenizer.encode("<|im_start|>user\nHello there<|im_end|>\n<|im_start|>assistant\n").ids
    engine = LLMEngine.from_pretrained(demo_dir, EngineConfig(num_blocks=64))
    engine.start()
    try:
        tokens: list[int] = []
        reasons = []
        req = GenerationRequest("r1", prompt, max_new_tokens=12, temperature=0.0, ignore_eos=True)
        async for output in AsyncEngine(engine).generate(req):
            tokens += output.token_ids
            reasons.append(output.finish_reason)
    finally:
        engine.stop()
    assert len(tokens) == 12
    assert reasons[-1] == "length" and all(r is None for r in reasons[:-1])
    assert all(0 <= t < config["vocab_size"] for t in tokens)
    assert engine.stats().free_blocks == 64
