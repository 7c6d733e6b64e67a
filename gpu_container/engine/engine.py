"""LLMEngine: the continuous-batching step loop in one background thread, with a thread-safe API.

Callers (the edge through asyncio, the Triton Python backend from its own threads) only touch the
inbox, the abort set and the stats snapshot, all under one condition; the scheduler, the block
manager, the KV cache and the model belong to the loop thread alone, but for the prefill lane
(prefill_lane.py): forwards of prefill chunks that run beside the loop's decode steps, over blocks
the scheduler holds for them, committed by the loop at the first step after they end (as far as they
got: the loop ends them early for a prompt that outranks theirs).
"""

from __future__ import annotations

import itertools
import math
import threading
from collections.abc import Callable
from collections.abc import Sequence as Seq
from pathlib import Path
from typing import Literal

import structlog

from gpu_container.engine.arrays import Floats
from gpu_container.engine.blas_threads import limit_blas_threads
from gpu_container.engine.block_manager import BlockManager
from gpu_container.engine.forward_batch import ForwardBatch
from gpu_container.engine.gemv_knee import model_knee
from gpu_container.engine.kv_cache import KVCache
from gpu_container.engine.loader import load_model
from gpu_container.engine.model import LlamaModel
from gpu_container.engine.prefill_lane import LaneWork, PrefillLane, lane_wanted
from gpu_container.engine.prefix_hash import root_hash
from gpu_container.engine.sampler import sample
from gpu_container.engine.scheduler import ScheduledChunk, Scheduler
from gpu_container.engine.sequence import Sequence, SequenceStatus
from gpu_container.engine.step_budget import PrefillBudget, PromptChunk, calibrate, step_clock
from gpu_container.engine.types import EngineConfig, EngineStats, FinishReason, SamplingParams, TokenOutput

log = structlog.get_logger(__name__)

_State = Literal["new", "running", "stopped"]
# A sequence and the output its callback receives.
_Emission = tuple[Sequence, TokenOutput]


class LLMEngine:
    def __init__(
        self,
        model: LlamaModel,
        config: EngineConfig,
        eos_token_ids: Seq[int],
        on_published: Callable[[EngineStats], None] | None = None,
    ) -> None:
        """on_published, if given, is called from the engine thread after each step's outputs went
        out, with the fresh stats: the engine process sends one message per step from it."""
        self._model = model
        self._on_published = on_published
        self._config = config
        self._eos = frozenset(eos_token_ids)
        mc = model.config
        self._cache = KVCache.allocate(
            mc.num_hidden_layers, config.num_blocks, config.block_size, mc.num_key_value_heads, mc.head_dim
        )
        self._blocks = BlockManager(config.num_blocks, config.block_size, config.enable_prefix_caching)
        self._prefill_budget: PrefillBudget | None = None
        self._clock = step_clock(config.blas_threads)
        self._lane: PrefillLane | None = None
        self._lane_work: LaneWork | None = None
        # Aborts of sequences the lane is prefilling: their blocks are freed once it is done.
        self._deferred_aborts: set[Sequence] = set()
        # A sequence alone must always fit the pool, or preempting everything else would not save it.
        self.max_model_len = min(
            config.max_model_len, mc.max_position_embeddings, config.num_blocks * config.block_size
        )
        # The width of a logits row: the token ids a request may name (its prompt, its logit_bias).
        self.vocab_size = mc.vocab_size
        self._scheduler = self._new_scheduler()
        self._cond = threading.Condition()
        self._state: _State = "new"
        self._thread: threading.Thread | None = None
        self._inbox: list[Sequence] = []
        self._aborts: set[str] = set()
        self._live: dict[str, Sequence] = {}
        self._arrivals = itertools.count()
        self._steps = 0
        self._prompt_tokens = 0
        self._generated_tokens = 0
        self._stalled = False
        self._stats = self._snapshot()

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        config: EngineConfig,
        on_published: Callable[[EngineStats], None] | None = None,
    ) -> LLMEngine:
        model = load_model(path)
        return cls(model, config, model.config.eos_token_ids, on_published)

    def start(self) -> None:
        with self._cond:
            if self._state != "new":
                return
            self._state = "running"
            if self._config.blas_threads > 0:
                limit_blas_threads(self._config.blas_threads)
            self._set_knee()
            config = self._config
            if config.batching == "continuous" and lane_wanted(config.prefill_lane, config.blas_threads):
                self._lane = PrefillLane(
                    self._model, self._cache, config.block_size, config.lane_piece_tokens
                )
            elif config.prefill_slowdown > 0:  # the lane makes the time budget moot: nothing waits on it
                self._calibrate()
            self._thread = threading.Thread(target=self._run, name="llm-engine", daemon=True)
            self._thread.start()
        log.info(
            "engine started",
            num_blocks=self._config.num_blocks,
            block_size=self._config.block_size,
            max_num_seqs=self._config.max_num_seqs,
            max_num_batched_tokens=self._config.max_num_batched_tokens,
            max_model_len=self.max_model_len,
            prefill_lane=self._lane is not None,
        )

    def _new_scheduler(self) -> Scheduler:
        budget = None if self._prefill_budget is None else self._prefill_budget.tokens
        return Scheduler(self._config, self._blocks, budget, self._eos, self.max_model_len)

    def _set_knee(self) -> None:
        """The GEMV/GEMM knee: the setting's, else measured here, after BLAS got its thread count
        and before the step cost is calibrated (whose model bends at the knee)."""
        configured = self._config.gemv_knee_rows
        start = self._clock()
        self._model.knee_rows = configured or model_knee(self._model, self._clock)
        log.info(
            "engine gemv knee",
            knee_rows=self._model.knee_rows,
            measured=not configured,
            took_ms=round((self._clock() - start) * 1e3, 1),
        )

    def _calibrate(self) -> None:
        """Measure the step cost and budget prefill by time. Before the loop runs: calibration
        writes scratch K/V into blocks nobody holds yet."""
        cost = calibrate(self._model, self._cache, self._clock)
        config = self._config
        self._prefill_budget = PrefillBudget(
            cost,
            config.prefill_slowdown,
            config.max_num_batched_tokens,
            config.min_prefill_chunk,
        )
        self._scheduler = self._new_scheduler()
        log.info(
            "engine step cost calibrated",
            fixed_ms=round(cost.fixed_s * 1e3, 2),
            per_row_ms=round(cost.per_row_s * 1e3, 3),
            per_row_gemm_ms=round(cost.per_row_gemm_s * 1e3, 3),
            gemm_jump_ms=round(cost.gemm_jump_s * 1e3, 3),
            per_decode_ms=round(cost.per_decode_s * 1e3, 3),
            decode_key_us=round(cost.decode_key_s * 1e6, 3),
            key_read_us=round(cost.key_read_s * 1e6, 3),
            attention_us_per_kilopair=round(cost.attention_s * 1e9, 3),
            knee_rows=cost.knee_rows,
        )

    @property
    def running(self) -> bool:
        """Started, not stopped, and its loop thread alive (a loop that died answers False)."""
        with self._cond:
            return self._state == "running" and self._thread is not None and self._thread.is_alive()

    def stop(self) -> None:
        """Finish every request with "cancelled" and end the loop thread. Idempotent."""
        with self._cond:
            if self._state == "stopped":
                return
            started = self._state == "running"
            self._state = "stopped"
            self._cond.notify_all()
        if not started:
            self._cancel_all()
        elif self._thread is not threading.current_thread() and self._thread is not None:
            self._thread.join()

    def add_request(
        self,
        request_id: str,
        prompt_ids: Seq[int],
        params: SamplingParams,
        on_output: Callable[[TokenOutput], None],
        priority: int = 0,
        cache_salt: str = "",
    ) -> None:
        """Queue a request. on_output is called from the engine thread with each step's new tokens.
        It shares prefix-cache blocks only with requests of the same cache_salt (contract.py)."""
        prompt = [int(t) for t in prompt_ids]
        self._validate(prompt, params)
        with self._cond:
            if self._state == "stopped":
                raise RuntimeError("engine is stopped")
            if request_id in self._live:
                raise ValueError(f"request {request_id!r} is already running")
            seq = Sequence(
                request_id, prompt, params, on_output, priority, next(self._arrivals), root_hash(cache_salt)
            )
            self._live[request_id] = seq
            self._inbox.append(seq)
            # notify_all: wait_until_idle callers share this condition with the loop thread.
            self._cond.notify_all()

    def abort(self, request_id: str) -> None:
        """Cancel a request and free its KV blocks; unknown or finished ids are ignored."""
        with self._cond:
            if request_id in self._live:
                self._aborts.add(request_id)
                self._cond.notify_all()

    def wait_until_idle(self, timeout: float | None = None) -> bool:
        """Block until no request is queued or running (e.g. to drain before stop); False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._live, timeout)

    def stats(self) -> EngineStats:
        with self._cond:
            return self._stats

    def _validate(self, prompt: list[int], params: SamplingParams) -> None:
        if not prompt:
            raise ValueError("prompt is empty")
        if len(prompt) > self._config.max_model_len:
            raise ValueError(
                f"prompt has {len(prompt)} tokens, max_model_len is {self._config.max_model_len}"
            )
        if len(prompt) > self.max_model_len:
            raise ValueError(
                f"prompt has {len(prompt)} tokens, this engine holds at most {self.max_model_len}"
            )
        vocab = self.vocab_size
        if min(prompt) < 0 or max(prompt) >= vocab:
            raise ValueError(f"prompt has token ids outside [0, {vocab})")
        # The edge refuses these first; checked here too, since an id past the row would fail the
        # sampler mid-generation (an error the caller cannot tell from a broken replica's), and a
        # negative one would quietly bias a token counted from the row's end.
        if any(not 0 <= token < vocab for token, _ in params.logit_bias):
            raise ValueError(f"logit_bias has token ids outside [0, {vocab})")
        # So for the stop tokens, which min_tokens holds back by setting them in the row.
        stops = (*params.stop_token_ids, *(params.min_tokens_ids or ()))
        if any(not 0 <= token < vocab for token in stops):
            raise ValueError(f"stop_token_ids has token ids outside [0, {vocab})")
        if params.max_new_tokens < 1:
            raise ValueError("max_new_tokens must be at least 1")
        # The Triton model reads these from float tensors that nothing bounds as the edge's schema
        # does: a NaN or an infinity past here is NaN in the sampler's row (inf - inf; -inf / inf
        # where min_tokens holds tokens back), which failed the reply midway or picked nonsense
        # tokens with no error at all. `not 0 <= x < inf` is written so that NaN fails it.
        if not 0 <= params.temperature < math.inf or not 0 < params.top_p <= 1 or params.top_k < 0:
            raise ValueError("temperature must be a finite number >= 0, top_p in (0, 1] and top_k >= 0")
        if not 0 < params.repetition_penalty < math.inf:
            raise ValueError("repetition_penalty must be a finite number > 0")
        additive = (params.presence_penalty, params.frequency_penalty, *(b for _, b in params.logit_bias))
        if not all(math.isfinite(value) for value in additive):
            raise ValueError("presence_penalty, frequency_penalty and logit_bias must be finite numbers")
        if params.min_tokens < 0:
            raise ValueError("min_tokens must be >= 0")

    def _run(self) -> None:
        while True:
            with self._cond:
                while not (
                    self._state == "stopped"
                    or self._inbox
                    or self._aborts
                    or self._has_runnable()
                    or self._lane_done()
                ):
                    self._cond.wait()
                if self._state == "stopped":
                    break
                inbox, self._inbox = self._inbox, []
                aborted = [self._live[rid] for rid in self._aborts]
                self._aborts.clear()
            try:
                self._admit(inbox)
                emitted = self._abort(aborted)
                emitted += self._step()
            except Exception as exc:
                # A bug outside the model (scheduler, bookkeeping): the state cannot be trusted any more.
                log.exception("engine loop failed; failing every request and resetting the KV pool")
                emitted = self._reset(_describe(exc))
            self._publish(emitted)
        self._cancel_all()
        if self._lane is not None:
            self._lane.close()

    def _abort(self, seqs: list[Sequence]) -> list[_Emission]:
        """Cancel these sequences now, but those the lane is prefilling once it is done."""
        emitted: list[_Emission] = []
        for seq in seqs:
            if self._lane_work is not None and self._scheduler.is_held(seq):
                self._deferred_aborts.add(seq)
                self._lane_work.stop.set()  # the rest of its chunk would be thrown away
            else:
                emitted.append(self._finish(seq, "cancelled"))
        return emitted

    def _has_runnable(self) -> bool:
        return self._scheduler.has_work() and not self._stalled

    def _lane_done(self) -> bool:
        return self._lane_work is not None and self._lane_work.future.done()

    def _lane_ended(self, _: object) -> None:
        """Wake the loop, which may be waiting for nothing but the lane (from the lane's thread)."""
        with self._cond:
            self._cond.notify_all()

    def _admit(self, inbox: list[Sequence]) -> None:
        for seq in inbox:
            self._scheduler.add(seq)
            self._prompt_tokens += len(seq.prompt_ids)

    def _step(self) -> list[_Emission]:
        emitted = self._collect_lane()
        if self._lane_work is not None and self._scheduler.outranks_held():
            self._lane_work.stop.set()  # the lane ends at its next piece, and the prompt goes first
        scheduled = self._scheduler.schedule()
        if not scheduled:
            # Nothing to do until the lane's work ends, or something arrives; nothing schedulable
            # with the lane idle (should not happen: a lone sequence always fits) must not spin.
            self._stalled = True
            return emitted
        self._stalled = False
        self._steps += 1
        decodes = [c for c in scheduled if c.num_tokens == 1 and c.completes]
        prefill = [c for c in scheduled if c.num_tokens > 1 or not c.completes]
        if self._lane is not None and prefill:
            # The prefill goes to the lane and the decodes step on without waiting for it. With
            # no decodes too: the loop, free, then hears an arrival that outranks the lane's work.
            self._lane_work = self._lane.submit(prefill)
            self._lane_work.future.add_done_callback(self._lane_ended)
            self._scheduler.hold(c.seq for c in prefill)
            if not decodes:
                return emitted
            scheduled = decodes
        return emitted + self._run_here(scheduled)

    def _run_here(self, chunks: list[ScheduledChunk]) -> list[_Emission]:
        """Compute the chunks on the loop thread and commit them; the step refines the time budget."""
        started = self._clock()
        try:
            logits = self._forward_one(chunks)
        except Exception:
            log.exception("engine step failed; retrying its sequences one by one", sequences=len(chunks))
            return self._isolate(chunks)
        if self._prefill_budget is not None:
            decoding = [c.seq for c in chunks if c.num_tokens == 1 and c.completes]
            keys = sum(seq.num_computed_tokens + 1 for seq in decoding)
            prefill = [
                PromptChunk(c.num_tokens, c.seq.num_computed_tokens)
                for c in chunks
                if c.num_tokens > 1 or not c.completes
            ]
            self._prefill_budget.observe(len(decoding), prefill, self._clock() - started, keys)
        return self._commit(chunks, logits)

    def _collect_lane(self) -> list[_Emission]:
        """Commit the lane's prefill once it is done, as far as it got: release its sequences,
        cancel those aborted meanwhile, sample the first token of those it completed. The rest of
        a chunk it did not reach is scheduled again."""
        work = self._lane_work
        if work is None or not work.future.done():
            return []
        self._lane_work = None
        self._scheduler.release(c.seq for c in work.chunks)
        aborted, self._deferred_aborts = self._deferred_aborts, set()
        try:
            result = work.future.result()
        except Exception:
            emitted = [self._finish(seq, "cancelled") for seq in aborted]
            kept = [c for c in work.chunks if c.seq not in aborted]
            log.exception("prefill lane failed; retrying its sequences one by one", sequences=len(kept))
            return emitted + self._isolate(kept)
        computed = work.computed(result.rows)
        kept = [c for c in computed if c.seq not in aborted]
        # One logits row per completing chunk computed, in chunk order: the rows of the chunks kept.
        # Worked out before the aborted sequences are finished: that frees their blocks and resets
        # their computed tokens, so an aborted chunk that completed its prompt would no longer
        # count as completing, and every later prompt would take the row before its own.
        rows = [i for i, c in enumerate(c for c in computed if c.completes) if c.seq not in aborted]
        emitted = [self._finish(seq, "cancelled") for seq in aborted]
        return emitted + self._commit(kept, result.logits[rows])

    def _drain_lane(self) -> None:
        """Wait for the lane to stop writing the KV pool and forget its work (a reset, a stop)."""
        if self._lane_work is not None:
            self._lane_work.stop.set()
            self._lane_work.future.exception()  # waits; whatever it raised does not matter now
            self._scheduler.release(c.seq for c in self._lane_work.chunks)
            self._lane_work = None
        self._deferred_aborts = set()

    def _forward_one(self, chunks: list[ScheduledChunk]) -> Floats:
        return self._model.forward(ForwardBatch.from_chunks(chunks, self._config.block_size), self._cache)

    def _isolate(self, chunks: list[ScheduledChunk]) -> list[_Emission]:
        """Run a failed step's chunks alone, so only the sequences that fail on their own get "error".

        Safe to repeat: a chunk writes the same K/V to the same slots every time it runs.
        """
        emitted: list[_Emission] = []
        for chunk in chunks:
            try:
                logits = self._forward_one([chunk])
            except Exception as exc:
                if self._scheduler.is_padding(chunk.seq):
                    # Static batching's padding ended already (its client heard its finish): out
                    # of the batch, not finished again (a second final output, and _publish's
                    # second removal of its id raised out of the loop: the engine thread died).
                    self._scheduler.remove(chunk.seq, failed=True)
                    continue
                emitted.append(self._finish(chunk.seq, "error", error=_describe(exc)))
                continue
            emitted += self._commit([chunk], logits)
        return emitted

    def _commit(self, chunks: list[ScheduledChunk], logits: Floats) -> list[_Emission]:
        """Sample a token for each sequence whose chunk completed; the scheduler records it and
        applies the finish rules."""
        emitted: list[_Emission] = []
        for seq, row in zip(self._scheduler.advance(chunks), logits, strict=True):
            if self._scheduler.is_padding(seq):
                self._scheduler.postprocess(seq, 0)  # static batching's padding: heard by nobody
                continue
            try:
                token = sample(row, seq.params, seq.rng, seq.output_ids, seq.prompt_ids, self._eos)
            except Exception as exc:
                log.exception("sampling failed", request_id=seq.request_id)
                emitted.append(self._finish(seq, "error", error=_describe(exc)))
                continue
            self._generated_tokens += 1
            reason = self._scheduler.postprocess(seq, token)
            # The first token reports the prompt tokens its prefill found in the prefix cache.
            cached = seq.num_cached_tokens if len(seq.output_ids) == 1 else 0
            emitted.append((seq, TokenOutput(seq.request_id, [token], reason, cached_tokens=cached)))
        return emitted

    def _reset(self, error: str) -> list[_Emission]:
        """Fail every request the failed step's state held and start from an empty pool. Those added
        meanwhile, still in the inbox, never touched that state: they run on the new one. Failed
        with the others, they were admitted all the same at the next pass, streamed after their
        final "error", and their finish raised in `_publish` (already forgotten): the loop thread
        died, and with it every open stream."""
        self._drain_lane()
        with self._cond:
            pending = {id(seq) for seq in self._inbox}
            seqs = [seq for seq in self._live.values() if id(seq) not in pending]
        preemptions, old = self._scheduler.num_preemptions, self._blocks
        self._blocks = BlockManager(
            self._config.num_blocks, self._config.block_size, self._config.enable_prefix_caching
        )
        self._blocks.prefix_query_tokens = old.prefix_query_tokens
        self._blocks.prefix_hit_tokens = old.prefix_hit_tokens
        self._scheduler = self._new_scheduler()
        self._scheduler.num_preemptions = preemptions
        for seq in seqs:
            seq.status, seq.block_table = SequenceStatus.FINISHED, []
        return [(seq, TokenOutput(seq.request_id, [], "error", error)) for seq in seqs]

    def _finish(
        self,
        seq: Sequence,
        reason: FinishReason,
        token_ids: list[int] | None = None,
        error: str | None = None,
    ) -> _Emission:
        self._scheduler.remove(seq, failed=reason == "error")
        return seq, TokenOutput(seq.request_id, token_ids or [], reason, error)

    def _publish(self, emitted: list[_Emission]) -> None:
        """Refresh the stats, call back outside the lock, then forget the finished ids.

        The snapshot goes first so a caller told "finished" already sees the blocks freed; the ids
        go last so wait_until_idle returns only once every final output has been delivered.
        """
        with self._cond:
            self._stats = stats = self._snapshot()
        for seq, out in emitted:
            try:
                seq.on_output(out)
            except Exception:
                log.exception("on_output callback failed; aborting the request", request_id=seq.request_id)
                self.abort(seq.request_id)
        finished = [seq.request_id for seq, out in emitted if out.finish_reason is not None]
        if finished:
            with self._cond:
                for request_id in finished:
                    del self._live[request_id]
                    self._aborts.discard(request_id)
                if not self._live:
                    self._cond.notify_all()
        if self._on_published is not None:
            self._on_published(stats)

    def _cancel_all(self) -> None:
        self._drain_lane()
        with self._cond:
            inbox, self._inbox = self._inbox, []
            self._aborts.clear()
        self._admit(inbox)
        seqs = self._scheduler.live()
        self._publish([self._finish(seq, "cancelled") for seq in seqs])

    def _snapshot(self) -> EngineStats:
        return EngineStats(
            block_size=self._config.block_size,
            num_blocks=self._config.num_blocks,
            free_blocks=self._blocks.num_free_blocks,
            max_num_seqs=self._config.max_num_seqs,
            running=len(self._scheduler.running),
            waiting=len(self._scheduler.waiting) + len(self._inbox),
            steps=self._steps,
            prompt_tokens=self._prompt_tokens,
            generated_tokens=self._generated_tokens,
            preemptions=self._scheduler.num_preemptions,
            cached_blocks=self._blocks.num_cached_blocks,
            prefix_query_tokens=self._blocks.prefix_query_tokens,
            prefix_hit_tokens=self._blocks.prefix_hit_tokens,
        )


def _describe(exc: Exception) -> str:
    return f"{type(exc).__name__}: {exc}"
