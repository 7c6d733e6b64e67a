"""One simulated replica: an engine over `gpus` GPUs that batches either continuously (a freed
slot is refilled at once) or statically (a batch starts together and no one joins until its
longest member ends). Slots are in simulated requests (each `bundle` real sequences).

Continuous: a request's decode runs at the step time of the batch it joins, with prefill's share
folded in (the mean prompt per mean reply: chunked prefill rides in the same steps), so a full
replica produces what NVIDIA's table says for the design's lengths. Static: the whole batch's
prompts are prefilled first, then the batch steps at its full size until the longest reply ends
(padding), so a batch of n lasts as long as the longest of n replies.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from bench.fleet.step_curve import StepCurve
from bench.fleet.traffic import MEAN_CONTEXT_TOKENS, MEAN_OUTPUT_TOKENS, Request, output_quantile

Batching = Literal["continuous", "static"]


@dataclass
class Timing:
    ttft_s: float  # from admission to the first token
    done_s: float  # from admission to the last token
    release_s: float  # from admission until the slot is free again


class Replica:
    def __init__(self, curve: StepCurve, gpus: int, bundle: int, batching: Batching) -> None:
        self.curve = curve
        self.gpus = gpus
        self.bundle = bundle
        self.batching = batching
        self.slots = max(1, curve.max_sequences * gpus // bundle)
        self.running = 0
        self.batch_open = True  # static: may take a new batch (idle)
        self.accepting = True  # False once its host drains
        self.epoch = 0  # bumped when its host leaves: completions of an older epoch are void

    def sequences_per_gpu(self, running: int) -> float:
        return running * self.bundle / self.gpus

    def continuous_step_s(self, running: int) -> float:
        b = self.sequences_per_gpu(running)
        c = self.curve
        return c.fixed_s + b * (
            c.per_sequence_s + c.per_prefill_token_s * MEAN_CONTEXT_TOKENS / MEAN_OUTPUT_TOKENS
        )

    def tokens_per_s(self) -> float:
        """Real output tokens/s this replica produces now. Static: every held slot steps, finished
        members included (padding is work the GPU does, not output anyone reads)."""
        if self.running == 0:
            return 0.0
        if self.batching == "static":
            per_gpu = self.sequences_per_gpu(self.running)
            return self.running * self.bundle / (self.curve.fixed_s + self.curve.per_sequence_s * per_gpu)
        return self.running * self.bundle / self.continuous_step_s(self.running)

    def busy_fraction(self) -> float:
        """How much of its full-batch work the replica does now: continuous, its output rate over
        the full batch's; static, 1 while a batch runs (padding keeps every slot stepping)."""
        if self.batching == "static":
            return 1.0 if self.running else 0.0
        return self.tokens_per_s() / self.max_tokens_per_s()

    def max_tokens_per_s(self) -> float:
        return self.slots * self.bundle / self.continuous_step_s(self.slots)

    def admit(self, req: Request) -> Timing:
        """Continuous batching: join the running batch."""
        self.running += 1
        step = self.continuous_step_s(self.running)
        ttft = req.prompt_tokens * self.curve.per_prefill_token_s + step
        done = ttft + (req.output_tokens - 1) * step
        return Timing(ttft, done, done)

    def start_batch(self, batch: list[Request], max_tokens: int) -> list[Timing]:
        """Static batching: prefill everyone, then step at full size until the longest reply ends."""
        self.running += len(batch)
        self.batch_open = False
        n = len(batch) * self.bundle
        c = self.curve
        per_gpu = n / self.gpus
        prefill = sum(r.prompt_tokens for r in batch) * self.bundle / self.gpus * c.per_prefill_token_s
        step = c.fixed_s + c.per_sequence_s * per_gpu
        # The longest of n replies: the reply-length quantile 0.5^(1/n) is its median.
        longest = max(max(r.output_tokens for r in batch), output_quantile(0.5 ** (1 / n), max_tokens))
        end = prefill + math.ceil(longest) * step
        return [Timing(prefill + step, prefill + r.output_tokens * step, end) for r in batch]

    def release(self, count: int = 1) -> None:
        self.running -= count
        if self.running == 0:
            self.batch_open = True
