"""Continuous batching with chunked prefill, priority admission and preemption by recompute.

Every step first decodes one token for every running sequence, then gives the budget that is left
to the next chunks of prompts still being prefilled, then admits waiting sequences into what remains,
each pass in priority order; a waiting sequence that outranks every prompt still prefilling is
admitted before their chunks (prompts are served in priority order, not running ones first). A
step's token budget (max_num_batched_tokens) is shared by decodes and prefill chunks, and decodes
come first, so a long prompt is split over several steps and never stalls the decodes of the
others, whatever its priority. The engine may cap a step's prefill tokens further
by time (step_budget.py): a step that carries prefill lasts at most a set factor of a decode step.

Preemption: when a running sequence needs a new block and the pool is empty, the lowest-priority,
newest running sequence gives its blocks back and returns to the waiting queue to be recomputed from
scratch (prompt and the tokens it already produced). Recompute instead of swapping to host memory:
on a CPU engine there is no slower tier to swap to, and recomputing a prefill is cheap next to
decoding; the victim keeps its arrival order, so it is readmitted before anything that came later,
and its sampler state, so a seeded request still yields the same tokens.

A sequence whose prefill chunk the engine runs on its prefill lane (prefill_lane.py) is held until
the lane is done: no step schedules it, and preemption passes it over (the lane is writing its
blocks). While it holds any, steps carry decodes only and admit nobody: the lane is the prefill.
A waiting sequence that outranks every held one, and could be admitted once they are released
(outranks_held), has the engine end the lane's work at its next piece (prefill_lane.py), after
which it is admitted ahead of their next chunks.

Admission reserves blocks for the whole known sequence up front (the part of it found in the prefix
cache shared and counted as computed, see block_manager.py): a sequence that is admitted never
needs preempting before its prefill ends, and one that would not fit waits (strictly in priority
order; a smaller request behind it does not jump the queue, which would starve large ones). A waiting
sequence that does not fit may preempt running ones of strictly lower priority, newest first, when
that frees enough: paid traffic is not kept waiting behind a flood of free traffic already running.
Equal priorities never preempt each other for admission, so there is no ping-pong.
"""

from __future__ import annotations

import bisect
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from typing import Protocol

from gpu_container.engine.block_manager import BlockManager
from gpu_container.engine.sequence import Sequence, SequenceStatus
from gpu_container.engine.types import EngineConfig, FinishReason


@dataclass(frozen=True, slots=True)
class ScheduledChunk:
    """num_tokens tokens of seq, from its num_computed_tokens on, are computed this step."""

    seq: Sequence
    num_tokens: int

    @property
    def completes(self) -> bool:
        """Whether this chunk reaches the sequence's last token, so a new token is sampled after it.

        Meaningful until Scheduler.advance records the chunk."""
        return self.seq.num_computed_tokens + self.num_tokens == self.seq.num_tokens


class PrefillRule(Protocol):
    """The prompt tokens a step may carry: it decodes `decodes` sequences holding `decode_keys` keys
    of context in all, while `prompts` prompts wait for theirs, the first `context` tokens in."""

    def __call__(self, *, decodes: int, prompts: int, context: int, decode_keys: int) -> int: ...


@dataclass(slots=True)
class _Step:
    """What one step has scheduled so far: tokens per sequence, in order, and the budget left."""

    budget: int
    tokens: dict[Sequence, int] = field(default_factory=dict)

    def schedule(self, seq: Sequence, num_tokens: int) -> None:
        self.tokens[seq] = num_tokens
        self.budget -= num_tokens

    def unschedule(self, seq: Sequence) -> None:
        self.budget += self.tokens.pop(seq, 0)


class Scheduler:
    def __init__(
        self,
        config: EngineConfig,
        block_manager: BlockManager,
        prefill_budget: PrefillRule | None = None,
        eos_token_ids: Collection[int] = (),
        max_model_len: int | None = None,
    ) -> None:
        """prefill_budget, if given, caps the prompt tokens of a step (the time budget of
        step_budget.py); max_num_batched_tokens caps it too.
        eos_token_ids and max_model_len (default: the config's) are finish rules (postprocess)."""
        if config.max_num_batched_tokens < 1 or config.max_num_seqs < 1:
            raise ValueError("max_num_batched_tokens and max_num_seqs must be positive")
        self._config = config
        self._blocks = block_manager
        self._prefill_budget = prefill_budget
        self._eos = frozenset(eos_token_ids)
        self._max_model_len = max_model_len or config.max_model_len
        # Both kept sorted by Sequence.order_key: best first.
        self.waiting: list[Sequence] = []
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        self._padding: set[Sequence] = set()
        # Prefilling on the engine's lane: neither scheduled nor preempted until released, and
        # while any are, steps carry decodes only.
        self._held: set[Sequence] = set()

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        bisect.insort(self.waiting, seq, key=Sequence.order_key)

    def remove(self, seq: Sequence, *, failed: bool = False) -> None:
        """Take seq out of the scheduler and give its blocks back (finish or abort).

        Static batching: a member that ends before the rest of its batch stays in it as padding
        (its slot, its blocks and its row in every step, as in a fixed-shape batch) until the
        longest member ends; the engine drops its tokens (is_padding). Not one whose own forward
        `failed`: as padding it would fail its batch's every step, and be finished again."""
        if (
            self._config.batching == "static"
            and not failed
            and seq.status is SequenceStatus.RUNNING
            and seq not in self._padding
        ):
            if len(self.running) > len(self._padding) + 1:
                self._padding.add(seq)
                return
        self._padding.discard(seq)
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
        elif seq.status is SequenceStatus.WAITING:
            self.waiting.remove(seq)
        self._blocks.free(seq)
        seq.status = SequenceStatus.FINISHED

    def hold(self, seqs: Iterable[Sequence]) -> None:
        self._held.update(seqs)

    def release(self, seqs: Iterable[Sequence]) -> None:
        self._held.difference_update(seqs)

    def is_held(self, seq: Sequence) -> bool:
        return seq in self._held

    def outranks_held(self) -> bool:
        """Whether the first waiting sequence has a strictly higher priority than every held one
        and could be admitted once they are released: the lane's work is then cut short, as a
        prompt prefilling here is passed by it (schedule). One that could not (the pool taken by
        sequences it may not preempt) would only have the lane end its work at every piece."""
        if not (self._held and self.waiting):
            return False
        seq = self.waiting[0]
        if seq.priority <= max(held.priority for held in self._held):
            return False
        if self._fits(seq):
            return True
        # What _make_room_for could free once the held sequences are released.
        lower = [r for r in self.running if r.priority < seq.priority]
        return bool(lower) and self._blocks.can_allocate_after(seq, lower)

    def is_padding(self, seq: Sequence) -> bool:
        return seq in self._padding

    def live(self) -> list[Sequence]:
        """Every sequence a caller is waiting on (static batching's padding is not one)."""
        return [s for s in self.running if s not in self._padding] + self.waiting

    def schedule(self) -> list[ScheduledChunk]:
        """This step's work: decodes first, then prefill chunks of running sequences, then admissions."""
        if self._padding and len(self._padding) == len(self.running):
            for seq in list(self.running):  # the static batch's longest member has ended
                self.remove(seq)
        step = _Step(self._config.max_num_batched_tokens)
        preempted = self._schedule_running(step, decodes=True)
        if self._held:
            return [ScheduledChunk(seq, n) for seq, n in step.tokens.items()]
        if self._prefill_budget is not None:
            budget = self._prefill_budget(
                decodes=len(step.tokens),
                prompts=self._prompts_pending(),
                context=self._prefill_context(),
                decode_keys=sum(seq.num_computed_tokens + 1 for seq in step.tokens),
            )
            step.budget = min(step.budget, budget)
        best_prefilling = self._best_prefilling_priority()
        if not preempted and best_prefilling is not None and self._batch_open():
            # Prompts in priority order: a waiting one that outranks every prompt still prefilling
            # is admitted before their next chunks, which would otherwise take the whole budget
            # step after step (a paid request waited 25 s behind a free 1,800-token prompt).
            self._admit(step, above=best_prefilling)
        preempted |= self._schedule_running(step, decodes=False)
        if not preempted and self._batch_open():
            self._admit(step)
        return [ScheduledChunk(seq, n) for seq, n in step.tokens.items()]

    def _best_prefilling_priority(self) -> int | None:
        """The highest priority among running prompts still prefilling (None: none is)."""
        prefilling = (s.priority for s in self.running if s.num_uncomputed_tokens > 1 and s not in self._held)
        return max(prefilling, default=None)

    def _prompts_pending(self) -> int:
        """Prompts that could get prefill this step: running ones still prefilling, and the
        waiting ones that fit the free sequence slots."""
        prefilling = sum(1 for s in self.running if s.num_uncomputed_tokens > 1 and s not in self._held)
        admissible = len(self.waiting) if self._batch_open() else 0
        return prefilling + min(admissible, self._config.max_num_seqs - len(self.running))

    def _prefill_context(self) -> int:
        """Tokens already computed of the prompt that gets this step's prefill first: the best
        running one still prefilling, else a waiting one (0: its cached prefix is not known yet)."""
        prefilling = (s for s in self.running if s.num_uncomputed_tokens > 1 and s not in self._held)
        return next((s.num_computed_tokens for s in prefilling), 0)

    def _schedule_running(self, step: _Step, decodes: bool) -> bool:
        """Schedule the running decodes (or the running prefills); True if it had to preempt."""
        preempted = False
        for seq in list(self.running):
            if step.budget == 0:
                break
            if seq.status is not SequenceStatus.RUNNING or (seq.num_uncomputed_tokens == 1) != decodes:
                continue  # preempted earlier in this step, or belongs to the other pass
            if seq in self._held or seq in step.tokens:
                continue  # the lane's, or admitted ahead of this pass (its chunk is scheduled)
            n = min(seq.num_uncomputed_tokens, step.budget)
            while not self._blocks.can_hold(seq, seq.num_computed_tokens + n):
                # The worst running sequence not held: seq itself at worst.
                victim = next(s for s in reversed(self.running) if s not in self._held)
                step.unschedule(victim)
                self._preempt(victim)
                preempted = True
                if victim is seq:
                    break
            if seq.status is not SequenceStatus.RUNNING:
                break  # seq was the worst left; everything after it has been preempted too
            self._blocks.reserve(seq, seq.num_computed_tokens + n)
            step.schedule(seq, n)
        return preempted

    def _batch_open(self) -> bool:
        """Continuous batching admits at every step; static batching only until the running batch
        produced its first token (then nothing joins until its longest member ends)."""
        return self._config.batching == "continuous" or not any(s.output_ids for s in self.running)

    def _admit(self, step: _Step, above: int | None = None) -> None:
        """Admit waiting sequences in order while the budget lasts; with `above`, only while the
        next one's priority is strictly higher than that."""
        while self.waiting and step.budget > 0:
            seq = self.waiting[0]
            if above is not None and seq.priority <= above:
                break
            if not self._fits(seq):
                if not self._make_room_for(seq, step):
                    break
                continue
            self.waiting.pop(0)
            self._blocks.allocate(seq)  # its cached prefix, if any, counts as computed
            seq.status = SequenceStatus.RUNNING
            bisect.insort(self.running, seq, key=Sequence.order_key)
            step.schedule(seq, min(seq.num_uncomputed_tokens, step.budget))

    def _fits(self, seq: Sequence) -> bool:
        return len(self.running) < self._config.max_num_seqs and self._blocks.can_allocate(seq)

    def _make_room_for(self, seq: Sequence, step: _Step) -> bool:
        """Preempt the worst running sequence if it has strictly lower priority than seq and preempting
        lower-priority sequences can make seq fit at all; True if it preempted one."""
        lower = [r for r in self.running if r.priority < seq.priority and r not in self._held]
        if not lower or not self._blocks.can_allocate_after(seq, lower):
            return False
        victim = lower[-1]
        step.unschedule(victim)
        self._preempt(victim)
        return True

    def _preempt(self, seq: Sequence) -> None:
        if seq in self._padding:
            self.remove(seq)  # padding is not worth recomputing
            return
        self.running.remove(seq)
        self._blocks.free(seq)
        self.num_preemptions += 1
        self.add(seq)

    def advance(self, chunks: Iterable[ScheduledChunk]) -> list[Sequence]:
        """Record that the chunks' K/V are now in the cache. Returns the sequences whose chunk
        completed, in chunk order: one logits row each, and each due a token (postprocess)."""
        chunks = list(chunks)
        completing = [c.seq for c in chunks if c.completes]
        for chunk in chunks:
            chunk.seq.num_computed_tokens += chunk.num_tokens
            self._blocks.seal(chunk.seq)  # its newly full blocks join the prefix cache
        return completing

    def postprocess(self, seq: Sequence, token: int) -> FinishReason | None:
        """Append seq's sampled token and apply the finish rules; a finished sequence leaves (its
        blocks freed). The token that ends a sequence is part of its output. Static batching's
        padding takes a placeholder and never finishes here (it leaves with its batch)."""
        if seq in self._padding:
            seq.output_ids.append(0)
            if seq.num_tokens >= self._max_model_len:
                self.remove(seq)
            return None
        seq.output_ids.append(token)
        reason = self._finish_reason(seq, token)
        if reason is not None:
            self.remove(seq)
        return reason

    def _finish_reason(self, seq: Sequence, token: int) -> FinishReason | None:
        if token in seq.params.stop_token_ids or (token in self._eos and not seq.params.ignore_eos):
            return "stop"
        if len(seq.output_ids) >= seq.params.max_new_tokens or seq.num_tokens >= self._max_model_len:
            return "length"
        return None
