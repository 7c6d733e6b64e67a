"""The engine alone, driven from its own callbacks (no event loop, no HTTP): what every served
figure in bench/engine.py is compared against, and the rig for the scheduling experiments."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field

from gpu_container.engine.engine import LLMEngine
from gpu_container.engine.model import LlamaModel
from gpu_container.engine.types import EngineConfig, EngineStats, SamplingParams, TokenOutput

TIMEOUT_S = 1800.0


@dataclass
class Trace:
    """When one request was sent, and when each of its outputs arrived (one per engine step)."""

    sent: float
    times: list[float] = field(default_factory=list)
    tokens: int = 0
    done: float | None = None

    @property
    def ttft(self) -> float:
        return self.times[0] - self.sent

    @property
    def gaps(self) -> list[float]:
        return [b - a for a, b in zip(self.times, self.times[1:], strict=False)]


class Driver:
    """An LLMEngine with a recording callback; requests go in by id, traces come out."""

    def __init__(self, model: LlamaModel, config: EngineConfig) -> None:
        self.engine = LLMEngine(model, config, model.config.eos_token_ids, self._stepped)
        self.traces: dict[str, Trace] = {}
        # (wall clock, engine thread's CPU time) after each step: the CPU time a step took is what
        # the engine's budget controls, whatever the machine's other load does to the wall clock.
        self.steps: list[tuple[float, float]] = []
        self._cond = threading.Condition()
        self._loops = 0

    def __enter__(self) -> Driver:
        self.engine.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.engine.stop()

    def _stepped(self, _: EngineStats) -> None:
        """Called from the engine thread after each step (on_published)."""
        self.steps.append((time.perf_counter(), time.thread_time()))

    def step_cpu_s(self, start: float, stop: float) -> list[float]:
        """CPU time of each engine step that ran between two wall-clock instants (a step delivers
        its tokens before it ends: the one whose output came at `stop` ends after it)."""
        steps = list(self.steps)
        return [b[1] - a[1] for a, b in itertools.pairwise(steps) if a[0] < stop and b[0] > start]

    def _record(self, output: TokenOutput) -> None:
        now = time.perf_counter()
        with self._cond:
            trace = self.traces[output.request_id]
            if output.token_ids:
                trace.times.append(now)
                trace.tokens += len(output.token_ids)
            if output.finish_reason is not None:
                trace.done = now
            self._cond.notify_all()

    def add(self, request_id: str, prompt: Seq[int], params: SamplingParams, priority: int = 0) -> None:
        with self._cond:
            self.traces[request_id] = Trace(time.perf_counter())
        self.engine.add_request(request_id, prompt, params, self._record, priority=priority)

    def wait(self, *request_ids: str) -> None:
        with self._cond:
            finished = self._cond.wait_for(
                lambda: all(self.traces[r].done is not None for r in request_ids), TIMEOUT_S
            )
        if not finished:
            raise TimeoutError(f"requests did not finish within {TIMEOUT_S} s")

    def wait_tokens(self, request_id: str, count: int) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self.traces[request_id].tokens >= count, TIMEOUT_S)

    def _wait_any(self, live: list[str]) -> list[str]:
        """Block until one of `live` finishes; those still running."""
        with self._cond:
            self._cond.wait_for(lambda: any(self.traces[r].done is not None for r in live), TIMEOUT_S)
            return [r for r in live if self.traces[r].done is None]

    def closed_loop(
        self, prompt: Seq[int], streams: int, params: SamplingParams, requests: int
    ) -> tuple[int, float]:
        """`streams` requests always in flight until `requests` were served: (tokens, seconds)."""
        self._loops += 1
        prefix = f"loop{self._loops}-"
        sent = 0
        start = time.perf_counter()
        live: list[str] = []
        while sent < requests or live:
            while sent < requests and len(live) < streams:
                rid = f"{prefix}{sent}"
                self.add(rid, prompt, params)
                live.append(rid)
                sent += 1
            live = self._wait_any(live)
        wall = time.perf_counter() - start
        tokens = sum(t.tokens for rid, t in self.traces.items() if rid.startswith(prefix))
        return tokens, wall
