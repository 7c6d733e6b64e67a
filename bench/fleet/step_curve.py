"""Time of one engine step on one GPU, against the batch it carries:

    step(B, P) = fixed + per_sequence * B + per_prefill_token * P

B sequences decoding, P prompt tokens prefilled in the same step (chunked prefill). `fixed` is
streaming the weights once (memory-bound), `per_sequence` the attention and KV reads that grow with
the batch, `per_prefill_token` the prompt's compute. The form is what our engine's measured steps
follow (measure.py; `fit_cpu` fits it and reports how well); the GPU's coefficients are solved from
NVIDIA's published throughputs for Llama 3.3 70B FP8 on one H200 (gpu_figures.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bench.fleet import gpu_figures as fig


@dataclass(frozen=True)
class StepCurve:
    fixed_s: float
    per_sequence_s: float
    per_prefill_token_s: float
    max_sequences: int  # KV-limited batch at the design's context (~1.5K tokens per sequence)

    def step_s(self, batch: float, prefill_tokens: float = 0.0) -> float:
        return self.fixed_s + self.per_sequence_s * batch + self.per_prefill_token_s * prefill_tokens

    def tokens_per_s(self, batch: float) -> float:
        """Decode throughput of one GPU at this batch."""
        return batch / self.step_s(batch) if batch > 0 else 0.0

    def request_gpu_s(self, isl: float, osl: float, batch: float) -> float:
        """GPU time one request costs at this batch: its prompt, then its share of each step."""
        return isl * self.per_prefill_token_s + osl * self.step_s(batch) / batch


def kv_sequences(context_tokens: float) -> int:
    free = (fig.H200_HBM_BYTES - fig.LLAMA_70B_FP8_WEIGHT_BYTES) * fig.KV_FREE_FRACTION
    return int(free / (fig.LLAMA_70B_FP8_KV_BYTES_PER_TOKEN * context_tokens))


def h200_llama70b(context_tokens: float = 1500.0) -> StepCurve:
    """Coefficients from two published rows (1000/1000 and 2048/128), run at the KV-limited batch:

    per request: isl * c + osl * step(Bmax)/Bmax = osl / throughput, two rows, two unknowns
    (c and step(Bmax)/Bmax); `fixed` from the bandwidth roofline."""
    rows = {(r.isl, r.osl): r for r in fig.LLAMA_70B_H200_TP1}
    a, b = rows[(1000, 1000)], rows[(2048, 128)]
    lhs = np.array([[a.isl, a.osl], [b.isl, b.osl]], dtype=float)
    rhs = np.array([a.osl / a.output_tokens_per_s, b.osl / b.output_tokens_per_s])
    per_prefill, per_token_at_max = np.linalg.solve(lhs, rhs)
    bmax = kv_sequences(context_tokens)
    fixed = fig.LLAMA_70B_FP8_WEIGHT_BYTES / (fig.H200_HBM_BYTES_PER_S * fig.DECODE_BANDWIDTH_EFFICIENCY)
    per_seq = (per_token_at_max * bmax - fixed) / bmax
    return StepCurve(fixed, float(per_seq), float(per_prefill), bmax)


def predicted_throughput(curve: StepCurve, isl: int, osl: int) -> float:
    """Output tokens/s the curve predicts for a published row (the rows not used to fit it check it)."""
    return osl / curve.request_gpu_s(isl, osl, curve.max_sequences)


@dataclass(frozen=True)
class CpuFit:
    curve: StepCurve
    decode_residual: float  # largest |measured - fitted| / measured over the decode points
    prefill_residual: float


def fit_cpu(path: Path) -> CpuFit:
    """Least squares of the same form on our engine's measured steps (measure.py's JSON)."""
    data = json.loads(path.read_text())
    batches = np.array([float(k) for k in data["decode_step_s"]])
    steps = np.array(list(data["decode_step_s"].values()))
    (fixed, per_seq), *_ = np.linalg.lstsq(np.c_[np.ones_like(batches), batches], steps, rcond=None)
    prompts = np.array([float(k) for k in data["prefill_ttft_s"]])
    ttfts = np.array(list(data["prefill_ttft_s"].values()))
    # TTFT of a lone prompt = its prefill + one step of batch 1.
    per_prefill = float(np.sum(prompts * (ttfts - fixed - per_seq)) / np.sum(prompts * prompts))
    curve = StepCurve(float(fixed), float(per_seq), per_prefill, int(batches.max()))
    decode_res = float(np.max(np.abs(curve.fixed_s + curve.per_sequence_s * batches - steps) / steps))
    prefill_res = float(np.max(np.abs(curve.step_s(1, 0) + per_prefill * prompts - ttfts) / ttfts))
    return CpuFit(curve, decode_res, prefill_res)
