"""TensorRT-LLM's `tensorrt_llm` tensor contract, read into our engine's terms (and written back).

Pure functions over numpy arrays so the Python-backend model (engine_model.py) stays thin glue and
this part is type-checked and testable without a server.

Conventions taken from TensorRT-LLM: `end_id = -1` ignores the end token (fixed-length output);
`runtime_top_k = 1` is greedy decoding; `stop_words_list` is [ids; end offsets] padded with -1;
`embedding_bias` is a [vocab] row added to the logits, exactly the model's vocabulary long (the
engine's logit_bias, read back into (token id, bias) pairs of its nonzero entries); `min_length`
holds back the end_id alone until the reply has that many tokens (its logit masked,
penaltyKernels.cu), never the stop words, which end the reply whenever they come.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import msgspec
import numpy as np
import numpy.typing as npt

from gpu_container.engine.types import EngineConfig, SamplingParams

GetInput = Callable[[str], "npt.NDArray[np.generic] | None"]


class ContractError(ValueError):
    """The request does not fit the contract (missing input, unsupported value)."""


@dataclass(frozen=True, slots=True)
class ContractRequest:
    prompt_ids: list[int]
    params: SamplingParams
    streaming: bool
    stop: bool
    # TensorRT-LLM 0.16's `return_kv_cache_reuse_stats`: send the KV cache stats with every response.
    kv_cache_reuse_stats: bool = False


def _scalar(get: GetInput, name: str) -> float | int | bool | None:
    array = get(name)
    if array is None or array.size == 0:
        return None
    value: float | int | bool = array.reshape(-1)[0].item()
    return value


def stop_word_ids(stop_words: npt.NDArray[np.generic]) -> tuple[int, ...]:
    """Single-token stop words out of a [2, L] (or [1, 2, L]) stop_words_list."""
    rows = stop_words.reshape(-1, 2, stop_words.shape[-1])[0]
    ids, offsets = rows[0].tolist(), [o for o in rows[1].tolist() if o >= 0]
    words: list[int] = []
    start = 0
    for end in offsets:
        if end - start != 1:
            raise ContractError("only single-token stop words are supported")
        words.append(int(ids[start]))
        start = end
    return tuple(words)


def logit_bias_pairs(row: npt.NDArray[np.generic], vocab_size: int | None) -> tuple[tuple[int, float], ...]:
    """The (token id, bias) pairs of an `embedding_bias` row's nonzero entries. A row of another
    length than the model's vocabulary is refused, as TensorRT-LLM refuses it ("The embedding bias
    shape is not as expected"): a row cut short or run long means the sender counted another model."""
    values = row.reshape(-1).astype(np.float32)
    if vocab_size is not None and values.size != vocab_size:
        raise ContractError(
            f"embedding_bias has {values.size} values; the model's vocabulary has {vocab_size} tokens"
        )
    ids = np.flatnonzero(values)
    return tuple(zip(ids.tolist(), values[ids].tolist(), strict=True))


def decode_request(get: GetInput, vocab_size: int | None = None) -> ContractRequest:
    """`vocab_size`: the model's, which an `embedding_bias` row must match (None: not checked)."""
    input_ids = get("input_ids")
    output_len = _scalar(get, "request_output_len")
    if input_ids is None or output_len is None:
        raise ContractError("input_ids and request_output_len are required")
    prompt = input_ids.reshape(-1).tolist()
    length = _scalar(get, "input_lengths")
    if length is not None:
        prompt = prompt[: int(length)]
    temperature = _scalar(get, "temperature")
    top_k = _scalar(get, "runtime_top_k")
    top_p = _scalar(get, "runtime_top_p")
    # Absent, TensorRT-LLM seeds the request with 0 (defaultDecodingParams' getSeed): the same
    # prompt and settings sample the same reply each time. The stand-in does as it does, so a sender
    # that leaves the seed out is caught here, not first on a GPU.
    seed = _scalar(get, "random_seed") or 0
    presence = _scalar(get, "presence_penalty")
    repetition = _scalar(get, "repetition_penalty")
    frequency = _scalar(get, "frequency_penalty")
    bias_row = get("embedding_bias")
    logit_bias = logit_bias_pairs(bias_row, vocab_size) if bias_row is not None and bias_row.size else ()
    end_id = _scalar(get, "end_id")
    min_length = _scalar(get, "min_length")
    stop_words = get("stop_words_list")
    stop_ids = stop_word_ids(stop_words) if stop_words is not None and stop_words.size else ()
    if end_id is not None and int(end_id) >= 0:
        stop_ids = (*stop_ids, int(end_id))
    greedy = top_k == 1 or temperature == 0
    # TensorRT-LLM takes presence and frequency penalties off logits already scaled by 1 / temperature
    # (penaltyKernels.cu); the engine takes them off before its temperature, as vLLM does. Scaled by
    # the temperature here, a request means on this model what it means on TensorRT-LLM, so a sender
    # that sends OpenAI's values unchanged is caught here, not first on a GPU.
    # The kernel scales by the temperature whatever top_k is: top_k 1 at 0.2 still takes penalties
    # off logits five times as large.
    scale = float(temperature) if temperature else 1.0
    params = SamplingParams(
        max_new_tokens=int(output_len),
        temperature=0.0 if greedy else float(temperature if temperature is not None else 1.0),
        top_p=float(top_p) if top_p is not None else 1.0,
        top_k=0 if greedy or top_k is None else int(top_k),
        seed=int(seed),
        presence_penalty=float(presence) * scale if presence is not None else 0.0,
        repetition_penalty=float(repetition) if repetition is not None else 1.0,
        frequency_penalty=float(frequency) * scale if frequency is not None else 0.0,
        logit_bias=logit_bias,
        stop_token_ids=stop_ids,
        ignore_eos=end_id is not None and int(end_id) < 0,
        min_tokens=max(int(min_length), 0) if min_length is not None else 0,
        min_tokens_ids=(int(end_id),) if end_id is not None and int(end_id) >= 0 else (),
    )
    return ContractRequest(
        prompt_ids=[int(t) for t in prompt],
        params=params,
        streaming=bool(_scalar(get, "streaming")),
        stop=bool(_scalar(get, "stop")),
        kv_cache_reuse_stats=bool(_scalar(get, "return_kv_cache_reuse_stats")),
    )


@dataclass(frozen=True, slots=True)
class KvCacheReuseStats:
    """The three outputs TensorRT-LLM 0.16 writes on every response of a request that set
    `return_kv_cache_reuse_stats`, each [1, 1] INT32, in KV blocks. A model config must declare all
    three: Triton fails the response on an output its config does not declare. Here `total` is the
    prompt's blocks throughout (TensorRT-LLM's presumably grows with the reply; nothing reads it)."""

    reused: int
    total: int

    def arrays(self) -> dict[str, npt.NDArray[np.int32]]:
        return {
            "kv_cache_alloc_new_blocks": np.asarray([[self.total - self.reused]], dtype=np.int32),
            "kv_cache_reused_blocks": np.asarray([[self.reused]], dtype=np.int32),
            "kv_cache_alloc_total_blocks": np.asarray([[self.total]], dtype=np.int32),
        }


def output_arrays(
    token_ids: list[int], stats: KvCacheReuseStats | None = None
) -> dict[str, npt.NDArray[np.int32]]:
    """One response's tensors: output_ids [batch=1, beam=1, n] and sequence_length [1, 1], plus the
    KV cache stats when the request asked for them."""
    arrays = {
        "output_ids": np.asarray(token_ids, dtype=np.int32).reshape(1, 1, -1),
        "sequence_length": np.asarray([[len(token_ids)]], dtype=np.int32),
    }
    if stats is not None:
        arrays |= stats.arrays()
    return arrays


def engine_config_from_parameters(parameters: Mapping[str, str]) -> EngineConfig:
    """EngineConfig from the model's string parameters; fields not given keep their defaults.

    Triton hands every parameter over as a string: a lax convert parses the numbers and booleans
    and checks them against EngineConfig's bounds; the model's other parameters are not its own.
    """
    own = {name: parameters[name] for name in EngineConfig.__struct_fields__ if name in parameters}
    return msgspec.convert(own, EngineConfig, strict=False)
