"""Cache salts: sequences with equal tokens share prefix-cache blocks only when their salts match
(vLLM's cache_salt), so one tenant's cache hit never says what another tenant sent."""

from __future__ import annotations

from gpu_container.engine.block_manager import BlockManager
from gpu_container.engine.engine import LLMEngine
from gpu_container.engine.prefix_hash import ROOT_HASH, block_hashes, chain_hash, root_hash
from gpu_container.engine.sequence import Sequence
from gpu_container.engine.types import EngineConfig, SamplingParams
from tests.engine.collector import TIMEOUT_S, Collector
from tests.engine.tiny_llama import tiny_model

BLOCK = 4
PROMPT = list(range(2, 15))  # three full blocks and one token
GREEDY = SamplingParams(max_new_tokens=3, temperature=0.0, ignore_eos=True)


def _computed(blocks: BlockManager, salt: str, name: str) -> Sequence:
    """A sequence admitted and, as if prefilled, with every prompt token computed and sealed."""
    seq = Sequence(name, list(PROMPT), GREEDY, lambda _: None, prefix_root=root_hash(salt))
    blocks.allocate(seq)
    seq.num_computed_tokens = seq.num_tokens
    blocks.seal(seq)
    return seq


def _admitted(blocks: BlockManager, salt: str, name: str) -> Sequence:
    seq = Sequence(name, list(PROMPT), GREEDY, lambda _: None, prefix_root=root_hash(salt))
    blocks.allocate(seq)
    return seq


def test_the_salt_seeds_the_chain_and_empty_is_unsalted() -> None:
    assert root_hash("") == ROOT_HASH
    assert root_hash("a") != root_hash("b") and root_hash("a") == root_hash("a")
    unsalted = block_hashes(PROMPT, BLOCK)
    assert not set(block_hashes(PROMPT, BLOCK, root=root_hash("a"))) & set(unsalted)


def test_equal_tokens_share_blocks_only_under_equal_salts() -> None:
    blocks = BlockManager(16, BLOCK, enable_prefix_caching=True)
    owner = _computed(blocks, "tenant-a", "owner")

    same = _admitted(blocks, "tenant-a", "same")
    assert same.num_cached_tokens == 3 * BLOCK and same.block_table[:3] == owner.block_table[:3]

    other = _admitted(blocks, "tenant-b", "other")
    unsalted = _admitted(blocks, "", "unsalted")
    for stranger in (other, unsalted):
        assert stranger.num_cached_tokens == 0
        assert not set(stranger.block_table) & set(owner.block_table)

    # Released, the owner's blocks stay cached for its own salt only.
    for seq in (owner, same, other, unsalted):
        blocks.free(seq)
    assert _admitted(blocks, "tenant-b", "later").num_cached_tokens == 0
    assert _admitted(blocks, "tenant-a", "back").num_cached_tokens == 3 * BLOCK


def test_the_engine_reports_hits_per_salt() -> None:
    config = EngineConfig(block_size=BLOCK, num_blocks=32, max_num_seqs=4, max_num_batched_tokens=32)
    engine = LLMEngine(tiny_model()[0], config, eos_token_ids=[1])
    engine.start()
    seen = Collector()
    cached: dict[str, int] = {}
    try:
        for rid, salt in (("a1", "a"), ("b1", "b"), ("a2", "a"), ("plain1", ""), ("plain2", "")):
            engine.add_request(rid, PROMPT, GREEDY, seen, cache_salt=salt)
            seen.wait_finished(rid)
            cached[rid] = sum(out.cached_tokens for out in seen.outputs[rid])
        assert engine.wait_until_idle(TIMEOUT_S)
    finally:
        engine.stop()
    assert cached == {"a1": 0, "b1": 0, "a2": 3 * BLOCK, "plain1": 0, "plain2": 3 * BLOCK}
    # Same salt, same tokens: the same greedy output, cache or not.
    assert seen.tokens("a2") == seen.tokens("a1") == seen.tokens("b1")


def test_block_keys_are_128_bits_wide() -> None:
    """A hit trusts its parent's key, so keys must not collide in practice: the whole 128 bits of a
    parent feed its child, and keys use them (at 64 bits a large fleet nears a birthday collision)."""
    low = 12345
    assert chain_hash(low, PROMPT[:4]) != chain_hash(low | 1 << 100, PROMPT[:4])
    keys = block_hashes(list(range(4_000)), 4)
    assert max(keys).bit_length() > 120
    assert root_hash("tenant").bit_length() > 64 or root_hash("other").bit_length() > 64
