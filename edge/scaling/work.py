"""What a request costs a GPU replica, in seconds of the replica at a full batch: the work signal's
price (demand.py). A request's prompt is prefilled once; its reply is not written yet when it asks,
so the mean reply stands in for it:

    gpu_s = prompt_tokens x prefill_s_per_token + mean_reply_tokens x decode_s_per_token

`decode_s_per_token` is a full batch's step time over its sequences (step(Bmax) / Bmax): what one
more output token costs a replica that is kept full, which continuous batching does. Priced so,
the work asked for per second over the replicas in service is linear in load: 1.0 means every
replica is needed at its full-batch throughput, whatever the batch the replicas hold right now
(the number of sequences held is not: a replica at 80 % of its output holds 39 % of its sequences,
docs/bench-fleet.md).

The defaults ([metrics] prefill_s_per_token, decode_s_per_token, mean_reply_tokens) are one H200
serving Llama 3.3 70B FP8 at tensor parallelism 1 (bench/fleet/step_curve.py, from NVIDIA's
published throughputs) and the design's ~500-token replies; a replica over several GPUs costs
proportionally less per token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from edge.config import MetricsConfig

# bench/fleet/step_curve.h200_llama70b(): per_prefill_token_s and step(Bmax) / Bmax.
H200_LLAMA70B_PREFILL_S_PER_TOKEN = 1.28e-4
H200_LLAMA70B_DECODE_S_PER_TOKEN = 2.16e-4
DESIGN_MEAN_REPLY_TOKENS = 500.0


@dataclass(frozen=True)
class WorkPrice:
    prefill_s_per_token: float = H200_LLAMA70B_PREFILL_S_PER_TOKEN
    decode_s_per_token: float = H200_LLAMA70B_DECODE_S_PER_TOKEN
    mean_reply_tokens: float = DESIGN_MEAN_REPLY_TOKENS

    def gpu_s(self, requests: int, prompt_tokens: int) -> float:
        """Replica-seconds that `requests` requests with `prompt_tokens` prompt tokens in all ask for."""
        reply_s = requests * self.mean_reply_tokens * self.decode_s_per_token
        return prompt_tokens * self.prefill_s_per_token + reply_s


def work_price(metrics: MetricsConfig) -> WorkPrice:
    """The price `[metrics]` sets; a served model's own settings carry its `[models.NAME]` prices
    there (edge/models/served.py), so each model's demand is priced for its own replicas."""
    return WorkPrice(metrics.prefill_s_per_token, metrics.decode_s_per_token, metrics.mean_reply_tokens)
