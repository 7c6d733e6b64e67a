"""The edge fleet as one admission point (edge/admission/ summed over the instances): the limiter,
then a queue by tier (paid first), a 429 when the wait would be too long, free traffic kept off the
last `reserved_paid_fraction` of every replica's slots, and the least-loaded replica for each
request. It also keeps what the scaling signals read: the GPU time asked for past the limiter (the
deployed work signal, edge/scaling/demand.py), and requests in flight, queued and turned away (the
sequences signal before it)."""

from __future__ import annotations

import math
from collections import deque
from functools import partial

import simpy

from bench.fleet.gpu_group import GpuGroup, Host
from bench.fleet.limits import UserLimits
from bench.fleet.recorder import Recorder
from bench.fleet.replica import Replica, Timing
from bench.fleet.tiers import EdgeSettings
from bench.fleet.traffic import MEAN_OUTPUT_TOKENS, Request

RATE_HALF_LIFE_S = 10.0  # the departure rate the wait estimate divides by


class EdgeQueue:
    def __init__(
        self,
        env: simpy.Environment,
        settings: EdgeSettings,
        group: GpuGroup,
        recorder: Recorder,
        reserved_paid_fraction: float | None = None,
    ) -> None:
        self.env = env
        self.settings = settings
        self.group = group
        self.recorder = recorder
        self.reserved = (
            settings.reserved_paid_fraction if reserved_paid_fraction is None else reserved_paid_fraction
        )
        self.limits = UserLimits(settings.tiers)
        self.order = sorted(settings.tiers, key=lambda t: -settings.tiers[t].priority)
        self.queues: dict[str, deque[tuple[Request, float]]] = {t: deque() for t in self.order}
        self.in_flight = 0
        self.turned_away = 0  # refusals the scaling signal counts (not the limiter's)
        self.offered_gpu_s = 0.0  # GPU time asked for past the limiter, at a full batch (the work signal)
        self._rate = 0.0  # completions/s, decayed
        self._rate_at = 0.0
        self._host_of: dict[int, Host] = {}

    # -- arrival -------------------------------------------------------------------------------
    def arrive(self, req: Request) -> None:
        now = self.env.now
        self.recorder.offered(now, req.tier)
        if not self.limits.admit(req.tier, req.user, now, req.prompt_tokens + req.output_tokens):
            self.recorder.rejected(now, req.tier, "limit")
            return
        self.offered_gpu_s += self.request_cost_s(req.prompt_tokens)
        if not self.group.in_service():
            self._turn_away(req.tier, "no_replica")
            return
        ahead = sum(len(self.queues[t]) for t in self.order[: self.order.index(req.tier) + 1])
        rate = self._departure_rate()
        if ahead and rate > 0 and (ahead + 1) / rate > self.settings.tiers[req.tier].max_queue_wait_s:
            self._turn_away(req.tier, "wait")
            return
        self.queues[req.tier].append((req, now))
        self.dispatch()

    def request_cost_s(self, prompt_tokens: int) -> float:
        """GPU seconds a request costs on a full replica; the reply's length is not known yet, the
        mean reply stands in for it (what an edge knows: a running mean of its own replies)."""
        curve = self.group.curve
        return curve.request_gpu_s(prompt_tokens, MEAN_OUTPUT_TOKENS, curve.max_sequences)

    def _turn_away(self, tier: str, reason: str) -> None:
        self.turned_away += 1
        self.recorder.rejected(self.env.now, tier, reason)

    # -- dispatch ------------------------------------------------------------------------------
    def _free_cap(self, replica: Replica, tier: str) -> int:
        if tier == self.order[0]:
            return replica.slots
        return replica.slots - math.ceil(replica.slots * self.reserved)

    def dispatch(self) -> None:
        replicas = [(h, r) for h in self.group.in_service() for r in h.replicas if r.accepting]
        static = bool(replicas) and replicas[0][1].batching == "static"
        for tier in self.order:
            queue = self.queues[tier]
            while queue:
                cap_of = {id(r): self._free_cap(r, tier) for _, r in replicas}
                if static:
                    if not self._dispatch_static(tier, replicas, cap_of):
                        break
                    continue
                best = max(replicas, key=lambda hr: cap_of[id(hr[1])] - hr[1].running, default=None)
                if best is None or cap_of[id(best[1])] - best[1].running <= 0:
                    break
                host, replica = best
                req, enqueued = queue.popleft()
                self._start(host, replica, [req], [replica.admit(req)], [enqueued])

    def _dispatch_static(
        self, tier: str, replicas: list[tuple[Host, Replica]], cap_of: dict[int, int]
    ) -> bool:
        idle = next(((h, r) for h, r in replicas if r.batch_open and cap_of[id(r)] > 0), None)
        if idle is None:
            return False
        host, replica = idle
        batch: list[tuple[Request, float]] = []
        for t in self.order[self.order.index(tier) :]:
            while self.queues[t] and len(batch) < self._free_cap(replica, t):
                batch.append(self.queues[t].popleft())
        reqs = [r for r, _ in batch]
        cap = max(self.settings.tiers[r.tier].max_tokens for r in reqs)
        self._start(host, replica, reqs, replica.start_batch(reqs, cap), [e for _, e in batch])
        return True

    def _start(
        self, host: Host, replica: Replica, reqs: list[Request], timings: list[Timing], enqueued: list[float]
    ) -> None:
        now = self.env.now
        epoch = replica.epoch
        for req, timing, since in zip(reqs, timings, enqueued, strict=True):
            self.in_flight += 1
            self.recorder.first_token(now, req.tier, now - since + timing.ttft_s)
            self.env.timeout(timing.done_s).callbacks.append(partial(self._finished, req.output_tokens))
        releases: dict[float, int] = {}
        for timing in timings:
            releases[timing.release_s] = releases.get(timing.release_s, 0) + 1
        for delay, count in releases.items():
            self.env.timeout(delay).callbacks.append(partial(self._release, host, replica, epoch, count))

    def _finished(self, output_tokens: int, _: simpy.Event) -> None:
        self.recorder.finished(self.env.now, output_tokens)

    def _release(self, host: Host, replica: Replica, epoch: int, count: int, _: simpy.Event) -> None:
        self.in_flight -= count
        self._count_departures(count)
        if replica.epoch != epoch:
            return  # its host left (drain timeout) and took the slots with it
        replica.release(count)
        self.group.host_idle(host)
        self.dispatch()

    def _count_departures(self, count: int) -> None:
        now = self.env.now
        self._rate = self._decayed(now) + count * math.log(2) / RATE_HALF_LIFE_S
        self._rate_at = now

    def _decayed(self, now: float) -> float:
        return float(self._rate * 0.5 ** ((now - self._rate_at) / RATE_HALF_LIFE_S))

    def _departure_rate(self) -> float:
        return self._decayed(self.env.now)

    # -- housekeeping --------------------------------------------------------------------------
    def expire(self) -> None:
        """Requests that waited past their tier's limit get their 429 now (FIFO: they are in front)."""
        now = self.env.now
        for tier, queue in self.queues.items():
            limit = self.settings.tiers[tier].max_queue_wait_s
            while queue and now - queue[0][1] > limit:
                queue.popleft()
                self._turn_away(tier, "wait")

    def queued(self) -> int:
        return sum(len(q) for q in self.queues.values())
