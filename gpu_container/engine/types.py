"""Plain data the engine exchanges with its callers (its async front, front.py; the Triton model).

The seam's contract (gpu_container/contract.py) is translated to these in the front (a request's
sampling, front.py) and from them in the request's mailbox (its outputs, mailbox.py); the Triton
model reads TensorRT-LLM's tensors into them (triton/cpu/tensors.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Annotated, Literal

import msgspec

# One finish reason across the seam: the engine ends a sequence for the reasons a replica reports.
from gpu_container.contract import FinishReason

__all__ = ["EngineConfig", "EngineStats", "FinishReason", "LaneSetting", "SamplingParams", "TokenOutput"]

# Whether the engine prefills on a thread of its own (prefill_lane.py).
LaneSetting = Literal["auto", "on", "off"]


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How to pick tokens. temperature 0 means greedy."""

    max_new_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    # Sample among the k most likely tokens (1: greedy, as TensorRT-LLM takes it); 0 is off.
    top_k: int = 0
    seed: int | None = None
    presence_penalty: float = 0.0
    # Over the prompt's and the reply's tokens (sampler.py); 1 is off.
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    # (token id, bias) pairs added to the logits before sampling (sampler.py): what the request
    # sent, not a [vocab] row, since most requests bias nothing and a few bias a handful of tokens.
    logit_bias: tuple[tuple[int, float], ...] = ()
    # Extra end tokens on top of the model's eos; the token that ends a sequence is emitted.
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    # No end before the reply holds this many tokens (vLLM's min_tokens, TensorRT-LLM's
    # min_length): until then the sampler gives the tokens that would end it a logit of -inf.
    min_tokens: int = 0
    # The tokens min_tokens holds back. None: every one that would end the reply (stop_token_ids,
    # and the model's eos unless ignore_eos), as vLLM holds them back; TensorRT-LLM's min_length
    # holds back its end_id alone, which the Triton model says (triton/cpu/tensors.py).
    min_tokens_ids: tuple[int, ...] | None = None


@dataclass(slots=True)
class TokenOutput:
    """New tokens of one request since the last output; finish_reason is set on the last one."""

    request_id: str
    token_ids: list[int] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    error: str | None = None
    # Prompt tokens found in the prefix cache (not prefilled): set on the output carrying the
    # sequence's first token only, so that outputs merged together add up to the request's figure.
    cached_tokens: int = 0


class EngineConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How one engine runs: the one engine-config type. The edge's `[engine]` settings extend it
    (edge/config.py EngineSettings) and the Triton CPU model reads it from its string parameters
    (triton/cpu/tensors.py), so a field added here reaches every path without a copy to forget.
    A msgspec Struct so that the edge's settings file is decoded and checked into it directly."""

    block_size: Annotated[int, msgspec.Meta(ge=1)] = 16
    num_blocks: Annotated[int, msgspec.Meta(ge=1)] = 1024
    max_num_seqs: Annotated[int, msgspec.Meta(ge=1)] = 64
    # Token budget of one step: decode tokens plus prefill chunks (chunked prefill).
    max_num_batched_tokens: Annotated[int, msgspec.Meta(ge=1)] = 512
    max_model_len: Annotated[int, msgspec.Meta(ge=1)] = 2048
    # BLAS threads for the process when the engine starts (see blas_threads.py); 0 leaves BLAS alone.
    blas_threads: Annotated[int, msgspec.Meta(ge=0)] = 1
    # Share the K/V of full blocks whose prompt prefix was already computed (block_manager.py).
    enable_prefix_caching: bool = True
    # A step carrying prefill may last this many times a decode-only step of the same batch: the
    # prefill budget in time, from step costs measured at start (step_budget.py). 0: tokens only.
    prefill_slowdown: Annotated[float, msgspec.Meta(ge=0)] = 0.0
    # The least prompt tokens a step gives each waiting prompt under the time budget when more
    # prompts wait than sequences decode (a wave of arrivals; step_budget.py).
    min_prefill_chunk: Annotated[int, msgspec.Meta(ge=1)] = 1
    # Prompts' prefill on a second thread while the steps decode on without it (prefill_lane.py):
    # "auto" when BLAS keeps to one thread and the process may use two CPUs or more. With a lane
    # prefill_slowdown does not apply (nothing waits on a chunk) and max_num_batched_tokens caps it.
    prefill_lane: LaneSetting = "auto"
    # The lane computes its chunk as forwards of at most this many rows in sequence, and ends its
    # work between two of them when a waiting prompt outranks the lane's (prefill_lane.py): what
    # such a prompt may wait for the lane, at about the cost of a large chunk a token.
    lane_piece_tokens: Annotated[int, msgspec.Meta(ge=1)] = 256
    # Up to how many rows a projection runs as one GEMV per row rather than one GEMM (model.py):
    # 0 measures it when the engine starts (gemv_knee.py), 1 is GEMM always; set it to reproduce
    # a run, or to skip the measurement.
    gemv_knee_rows: Annotated[int, msgspec.Meta(ge=0)] = 0
    # "static": a batch starts together and no one joins until its longest member ends (kept only
    # to measure continuous batching against, bench/engine.py).
    batching: Literal["continuous", "static"] = "continuous"

    def __post_init__(self) -> None:
        # Here, not only in the edge's settings check (edge/config.py _check_finite): the Triton
        # CPU model builds this from config.pbtxt's strings, which never pass that check.
        if not math.isfinite(self.prefill_slowdown):
            raise ValueError(f"prefill_slowdown ({self.prefill_slowdown}) must be a finite number")
        # The time budget needs room for prefill past a decode-only step (step_budget.py
        # PrefillBudget): one of 1 or below loaded, and the engine's start then failed.
        if 0 < self.prefill_slowdown <= 1:
            raise ValueError(
                f"prefill_slowdown ({self.prefill_slowdown:g}) must be 0 (tokens only) or above 1: "
                "a step carrying prefill lasts longer than a decode-only one"
            )
        # Every running sequence decodes one token a step within the step's budget: with fewer
        # tokens than sequences, those past the budget wait for others to finish (vLLM refuses it).
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be at least max_num_seqs "
                f"({self.max_num_seqs}): every running sequence decodes a token each step"
            )


@dataclass(frozen=True, slots=True)
class EngineStats:
    block_size: int
    num_blocks: int
    free_blocks: int
    max_num_seqs: int
    running: int
    waiting: int
    steps: int
    prompt_tokens: int
    generated_tokens: int
    # Sequences sent back to the waiting queue (to recompute) because the KV pool ran out.
    preemptions: int = 0
    # Free blocks that still hold a reusable prefix (part of free_blocks).
    cached_blocks: int = 0
    # Tokens looked up in the prefix cache at admission, and those found there (not prefilled).
    prefix_query_tokens: int = 0
    prefix_hit_tokens: int = 0

    @property
    def kv_tokens_total(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def kv_tokens_used(self) -> int:
        return (self.num_blocks - self.free_blocks) * self.block_size

    @property
    def prefix_hit_rate(self) -> float:
        return self.prefix_hit_tokens / self.prefix_query_tokens if self.prefix_query_tokens else 0.0
