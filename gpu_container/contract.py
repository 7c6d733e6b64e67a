"""The contract of the seam every request crosses: token ids go to a replica, token ids come back.

A replica is one GPU-side server that generates tokens: the local CPU engine, a local Triton, a
Triton + TensorRT-LLM host in the fleet. The edge speaks to each one through an `Upstream` (its
handle on that replica: generate, capacity, readiness), and sees nothing else of it.

This module lives in gpu_container/ so that both sides can import it: the edge (edge/upstreams/
re-exports it as edge.upstreams.base), the engine's async front and the Triton adapters, without
gpu_container/ ever importing the edge (tests/structure/test_layering.py).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Literal, Protocol

# The longest prompt + reply of a TensorRT-LLM engine built by gpu_container/triton/build_engine.py
# without --max-seq-len: the edge's context limit for Triton replicas whose model names none. An
# engine holds no more (TensorRT-LLM cuts a longer reply short, as if it had ended), so the edge
# refuses a longer request with a 400 before it reaches one.
TRTLLM_DEFAULT_MAX_SEQ_LEN = 8192

# Why a generation ended, as the replica reports it (the edge's own end reasons extend it).
FinishReason = Literal["stop", "length", "cancelled", "error"]


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    request_id: str
    prompt_ids: list[int]
    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    # The k most likely tokens only (vLLM's top_k, TensorRT-LLM's runtime_top_k); 0 is off.
    top_k: int = 0
    seed: int | None = None
    # Tokens that end the reply, as "stop", and are its last (the edge sends the model's end tokens
    # here unless ignore_eos, and a client's stop_token_ids); every id is within the vocabulary.
    stop_ids: list[int] = field(default_factory=list)
    # OpenAI's: a token's logit less presence_penalty once it was generated, and frequency_penalty
    # for every time it was (TensorRT-LLM's inputs of the same names).
    presence_penalty: float = 0.0
    # vLLM's and TensorRT-LLM's: a logit of a token in the prompt or the reply is divided by it when
    # positive, multiplied when negative; 1 is off.
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    # OpenAI's logit_bias: (token id, bias) pairs added to those tokens' logits before sampling,
    # greedy too (TensorRT-LLM's embedding_bias, dense). Pairs rather than a [vocab] row, so a
    # request carries only what the client sent; every id is within the model's vocabulary.
    logit_bias: tuple[tuple[int, float], ...] = ()
    priority: int = 0
    # Generate past the model's end tokens (vLLM's ignore_eos, TensorRT-LLM's end_id -1): a
    # fixed-length reply, as benchmarks and parity tests want; stop_ids still end it.
    ignore_eos: bool = False
    # No end token before the reply holds this many tokens (vLLM's min_tokens; TensorRT-LLM's
    # min_length, which holds back its end_id alone); at most max_new_tokens.
    min_tokens: int = 0
    # Requests with different salts never share prefix-cache blocks; "" shares with every other
    # unsalted request. The edge salts per user, so one user cannot learn from cached_tokens what
    # another sent (vLLM's cache_salt; OpenAI keeps its prompt caches per organization).
    cache_salt: str = ""


@dataclass(slots=True)
class Delta:
    """New tokens of one request since its last delta; the last delta has finish_reason set."""

    token_ids: list[int]
    finish_reason: FinishReason | None = None
    # Prompt tokens the replica served from its prefix cache instead of computing them (OpenAI's
    # usage.prompt_tokens_details.cached_tokens). Reported once, on the delta carrying the first
    # token, 0 on every other one, so the request's figure is the sum over its deltas (a consumer
    # that merges deltas adds them up); 0 throughout from a replica that does not report it.
    cached_tokens: int = 0


@dataclass(frozen=True, slots=True)
class Capacity:
    """What a replica can hold and holds now: KV-cache tokens and sequences cap a batch.

    `kv_block_tokens` is the replica's KV block size: a sequence occupies whole blocks, so the edge
    charges each request in multiples of it (1: no blocks, or not known).
    """

    kv_tokens_total: int
    kv_tokens_used: int
    max_sequences: int
    running: int
    waiting: int
    kv_block_tokens: int = 1
    # Prefix caching, where the replica reports it (0 otherwise): free KV tokens that still hold a
    # reusable prefix, prompt tokens looked up and found cached since it started, and sequences
    # it preempted (sent back to recompute) since it started.
    kv_tokens_cached: int = 0
    prefix_query_tokens: int = 0
    prefix_hit_tokens: int = 0
    preemptions: int = 0
    # Times the replica's engine died and was replaced (a local engine process; 0 otherwise).
    restarts: int = 0
    # The replica keeps requests of different cache salts apart in its prefix cache
    # (GenerationRequest.cache_salt). False: it pools every request's blocks (a Triton replica), so
    # its hit figures count one user's prompts found in another's blocks.
    salts_prefix_cache: bool = True
    # The longest prompt + reply one sequence may have here, as the replica reports it (a Triton
    # replica's engine build: gpu_container/triton/sequence_limit.py); 0: it does not say. Past it
    # the engine ends a reply short, so the edge holds requests within it.
    max_sequence_tokens: int = 0


class UpstreamError(Exception):
    """The replica failed (connection lost, server error). Raised from generate()."""


class ReplicaRestarting(UpstreamError):
    """The replica died and the upstream is bringing it back itself (the local engine process
    starts a new child: gpu_container/engine/engine_process.py). Raised from generate(), where the
    death is known for certain, so that the edge can tell a request that a short wait will serve
    (it waits for the same replica rather than failing with no other to go to) from a replica that
    failed for a reason nobody is mending. `back_in_s`: about how long until it serves again.

    `may_be_cause`: the request was on the replica when it died, a replica started in place of a
    dead one less than a minute (the engine process's _STABLE_S) before the request reached it: a
    crash again so soon may be the request's doing, as a prompt that crashes the engine crashes
    every new one. Such a request is not sent back to the replica it may have killed, nor invited to
    be sent again (a 502 the OpenAI SDK does not retry): sent back each time, one such request
    crashed the engine twice, and its SDK's retries, each told when the new child would serve, six
    times. False: it never reached the dead child (handed over after the death, or refused at
    once), or the crash was a first one (the first child's, or one that had served a minute), which
    is forgiven: the requests it held are sent back once, which costs a request that crashes the
    engine one crash more, the new child's, and none after; or it came to the new child beside
    requests sent back to it, which are the ones suspected then."""

    def __init__(self, message: str, back_in_s: float, *, may_be_cause: bool) -> None:
        super().__init__(message)
        self.back_in_s = back_in_s
        self.may_be_cause = may_be_cause


class RequestRejected(Exception):
    """The replica refused this request for its own parameters (the engine's ValueError, Triton's
    INVALID_ARGUMENT). Raised from generate(). The request's fault, not the replica's: it is
    answered 400 and the replica stays healthy; an UpstreamError would mark it suspect for everyone.
    """


class ContextLengthExceeded(RequestRejected):
    """A refusal of the prompt's length: longer than the replica holds, which the edge could not
    refuse first (a replica that does not say its limit). Answered as the edge's own refusal of it
    is, with the code a client trims its history on."""


class Upstream(Protocol):
    """The edge's handle on one replica."""

    name: str

    def generate(self, req: GenerationRequest) -> AsyncIterator[Delta]:
        """Stream deltas; the last one has finish_reason set. Closing the iterator early cancels."""
        ...

    async def capacity(self) -> Capacity: ...

    async def ready(self) -> bool: ...

    async def aclose(self) -> None: ...


class Restarts(Protocol):
    """What an upstream that brings its own replica back (the local engine process) may offer
    beside `Upstream`: the edge's health checks read it (edge/admission/replica_set.py) so that
    requests wait for a replica that is coming back instead of being turned away as from a dead
    one. A Triton host has none: who restarts it (its host's supervisor, the autoscaler) does not
    tell the edge, whose health checks alone say when it serves again."""

    def back_in_s(self) -> float | None:
        """While the replica is down and being restarted: about how long until it serves again (0
        once overdue). None otherwise: serving, stopped, or down with no restart expected soon (a
        new child failed to load)."""
        ...
