"""The GPU Auto Scaling group as AWS runs it with iac/modules/gpu_pool's settings: hosts that boot
cold (instance start, image pull, engine download, engine load) or start from the warm pool
(stopped, engine already on disk), serve, and on scale-in drain their streams (at most
scale_in_drain_s) before going back to the warm pool (reuse_on_scale_in).

The warm pool's size is what AWS documents (PutWarmPool): MaxGroupPreparedCapacity - desired, but
at least warm_pool_min_size; with the capacity unset (-1), max_size - desired. iac/modules/gpu_pool
sets it to warm_pool_min_size unless told otherwise: exactly warm_pool_min_size hosts wait warm.
Hosts that initialise for the pool boot cold, then stop.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

import simpy

from bench.fleet.replica import Replica
from bench.fleet.step_curve import StepCurve


@dataclass(frozen=True)
class HostTiming:
    """Seconds from launch to serving. Assumptions (no GPU here to time them), stated in docs/scale.md:
    a p5en.48xlarge boots in ~3-5 min, pulls the ~20 GB Triton + TensorRT-LLM image, downloads the
    ~70 GB FP8 engine from S3 and loads it into 8 GPUs; from the warm pool (stopped, image and engine
    on disk) only the start and the load remain."""

    cold_start_s: float = 600.0
    warm_start_s: float = 180.0


class State(Enum):
    BOOTING = "booting"  # launching into service (billed)
    PREPARING = "preparing"  # initialising for the warm pool (billed), then WARM
    WARM = "warm"  # stopped in the warm pool (volumes only: not billed as GPU time)
    IN_SERVICE = "in_service"
    DRAINING = "draining"
    GONE = "gone"  # terminated


@dataclass(eq=False)
class Host:
    replicas: list[Replica]
    state: State
    since: float = 0.0
    drain_ends: simpy.Event | None = field(default=None, repr=False)

    @property
    def running(self) -> int:
        return sum(r.running for r in self.replicas)


class GpuGroup:
    def __init__(
        self,
        env: simpy.Environment,
        make_replicas: Callable[[], list[Replica]],
        curve: StepCurve,
        gpus_per_host: int,
        min_size: int,
        max_size: int,
        warm_pool_min_size: int,
        scale_in_drain_s: float,
        timing: HostTiming,
        on_change: Callable[[], None],
        warm_pool_max_prepared: int = -1,
    ) -> None:
        self.env = env
        self._make = make_replicas
        self.curve = curve  # one GPU's step curve (the work signal prices requests on it)
        self.gpus_per_host = gpus_per_host
        self.min_size = min_size
        self.max_size = max_size
        self.warm_pool_min_size = warm_pool_min_size
        # MaxGroupPreparedCapacity: -1 (unset) is AWS's default, the group's max_size.
        self.max_prepared = max_size if warm_pool_max_prepared < 0 else warm_pool_max_prepared
        self.scale_in_drain_s = scale_in_drain_s
        self.timing = timing
        self._on_change = on_change  # a host joined or left service: the edge re-dispatches
        self.hosts: list[Host] = []
        self.desired = 0
        self.last_scale_out = -1e18

    # -- views -------------------------------------------------------------------------------
    def count(self, *states: State) -> int:
        return sum(1 for h in self.hosts if h.state in states)

    def in_service(self) -> list[Host]:
        return [h for h in self.hosts if h.state is State.IN_SERVICE]

    def billed_gpus(self) -> int:
        return self.gpus_per_host * self.count(
            State.BOOTING, State.PREPARING, State.IN_SERVICE, State.DRAINING
        )

    def warming(self) -> bool:
        return self.count(State.BOOTING) > 0

    # -- start of day --------------------------------------------------------------------------
    def start(self, in_service: int) -> None:
        self.desired = max(self.min_size, min(self.max_size, in_service))
        for _ in range(self.desired):
            self.hosts.append(Host(self._make(), State.IN_SERVICE))
        for _ in range(self._warm_pool_target()):
            self.hosts.append(Host(self._make(), State.WARM))
        self._on_change()

    # -- the ASG's reconciliation ------------------------------------------------------------
    def set_desired(self, desired: int) -> None:
        desired = max(self.min_size, min(self.max_size, desired))
        if desired > self.desired:
            self.last_scale_out = self.env.now
        self.desired = desired
        self._reconcile()

    def _warm_pool_target(self) -> int:
        return max(self.warm_pool_min_size, self.max_prepared - self.desired)

    def _reconcile(self) -> None:
        serving = self.count(State.BOOTING, State.IN_SERVICE)
        while serving < self.desired:
            warm = next((h for h in self.hosts if h.state is State.WARM), None)
            if warm is not None:
                self._boot(warm, self.timing.warm_start_s)
            else:
                host = Host(self._make(), State.BOOTING)
                self.hosts.append(host)
                self._boot(host, self.timing.cold_start_s)
            serving += 1
        while serving > self.desired:
            # Newest booting first (nothing to drain), else the least loaded in service.
            booting = [h for h in self.hosts if h.state is State.BOOTING]
            if booting:
                booting[-1].state = State.WARM  # AWS returns it to the pool
            else:
                victim = min(self.in_service(), key=lambda h: h.running)
                self._drain(victim)
            serving -= 1
        pool = self.count(State.WARM, State.PREPARING)
        while pool < self._warm_pool_target():
            host = Host(self._make(), State.PREPARING)
            self.hosts.append(host)
            self._prepare(host)
            pool += 1

    def _boot(self, host: Host, seconds: float) -> None:
        host.state = State.BOOTING
        host.since = self.env.now

        def ready(_: simpy.Event) -> None:
            if host.state is State.BOOTING:
                host.state = State.IN_SERVICE
                host.since = self.env.now
                for r in host.replicas:
                    r.accepting = True
                self._on_change()

        self.env.timeout(seconds).callbacks.append(ready)

    def _prepare(self, host: Host) -> None:
        def prepared(_: simpy.Event) -> None:
            if host.state is State.PREPARING:
                host.state = State.WARM
                self._reconcile()

        self.env.timeout(self.timing.cold_start_s).callbacks.append(prepared)

    def _drain(self, host: Host) -> None:
        host.state = State.DRAINING
        host.since = self.env.now
        for r in host.replicas:
            r.accepting = False
        ends = self.env.timeout(self.scale_in_drain_s)
        host.drain_ends = ends
        # Only this drain's timeout: the host may be back in service and draining again by then.
        ends.callbacks.append(lambda _: self._leave(host) if host.drain_ends is ends else None)
        self._on_change()

    def host_idle(self, host: Host) -> None:
        """A draining host's last stream ended: it leaves now (the host agent completes the hook)."""
        if host.state is State.DRAINING and host.running == 0:
            self._leave(host)

    def _leave(self, host: Host) -> None:
        if host.state is not State.DRAINING:
            return
        host.drain_ends = None
        # Streams cut by the drain timeout are lost work; their slots go with the host.
        for r in host.replicas:
            r.running = 0
            r.batch_open = True
            r.epoch += 1
        prepared = self.count(State.WARM, State.PREPARING, State.BOOTING, State.IN_SERVICE)
        if prepared < max(self.max_prepared, self.warm_pool_min_size + self.desired):
            host.state = State.WARM
        else:
            host.state = State.GONE
            self.hosts.remove(host)
        self._reconcile()
