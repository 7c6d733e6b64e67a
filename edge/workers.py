"""`floodgate serve --workers N`: N edge processes on one port, one per core.

One event loop is one core: a process holds a few thousand streams and opens a few hundred per
second (docs/bench-streams.md). Each worker is a whole edge (its own app, limiter client,
dispatcher and drain) listening on `[server] host:port` with SO_REUSEPORT, so the kernel spreads
new connections over the workers' own accept queues (each `[server] listen_backlog` deep) and a
worker's 429 `server_busy` (`[server] max_open_streams`) answers for that worker alone.

Each worker starts the replicas of its own that the settings name (the local engines, `--triton
local`: one set per worker, which it fills whole, since no other worker reaches them) or reaches
the shared ones (`--triton host:port`, `asg:`), of which it fills its fleet share. Limits and shares
stay exact because every worker counts as one edge instance. The limits must live in one store
shared by the workers: `--workers` > 1 requires `[limiter] backend = "redis"` (with the in-memory
limiter each worker would enforce a limit of its own, so it refuses to start instead). With Redis,
each worker joins the fleet as a member of its own (edge/membership: the member id is host:pid), so
the shares of the shared replicas and the fail-open divisors count every worker; the static
`[limiter] instance_count`, what the fleet is assumed to be while Redis is unreachable, is
multiplied by N, since it counts edge hosts and each host now runs N instances.

Each worker's operator listener is `ops_port + i` (0 stays "any free port"): `/metrics` is per
worker, as it is per host. Every log line carries its worker's index (`worker`), as the workers
share one standard output. No load balancer checks one worker's readiness on the shared port, so a
worker listens on it only once it may take work: one joining the fleet on shared replicas has no
share of them until the others made room (two beats), and would answer 503 no_replica meanwhile
(edge/server.py); its operator listener, `/readyz` included, answers from the start.

The parent only supervises: SIGTERM or SIGINT is passed on to every worker (each drains or cuts
as `floodgate serve` does), and a worker that exits on its own stops the others, so a broken
worker never leaves a half-served port, and `serve` then exits with that worker's code (128 + N for
one killed by signal N), or 1 where it was 0 (the edge stopped unasked: a supervisor must start it
again); a parent killed outright has
its workers drain and leave.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import multiprocessing
import multiprocessing.connection
import multiprocessing.resource_tracker
import os
import signal
import sys
from collections.abc import Sequence
from multiprocessing.process import BaseProcess
from types import FrameType
from typing import Any

from edge.config import Settings


class WorkersRefused(Exception):
    """The settings cannot be served by several workers (the message says why and what to do)."""


def worker_overrides(settings: Settings, workers: int, index: int) -> dict[str, dict[str, object]]:
    """What worker `index` of `workers` changes in the settings (see the module doc)."""
    if workers > 1 and settings.limiter.backend != "redis":
        raise WorkersRefused(
            f"--workers {workers} needs the limits in one store the workers share: set [limiter] "
            f'backend = "redis" (with the {settings.limiter.backend!r} limiter each worker would '
            "enforce every limit on its own). Or run one worker per host."
        )
    if workers > 1 and settings.server.port == 0:
        raise WorkersRefused(f"--workers {workers} needs a fixed port to share (server.port is 0).")
    ops_port = settings.server.ops_port
    own = ops_port + index if ops_port else 0
    if own and (own == settings.server.port or own > 65535):
        # Loaded in the worker, this was a ValidationError traceback there, the others then stopped.
        raise WorkersRefused(
            f"--workers {workers}: worker {index}'s operator port, server.ops_port {ops_port} + {index}, "
            f"is {'server.port' if own == settings.server.port else 'past 65535'}: give server.ops_port "
            f"a range of {workers} ports of its own."
        )
    return {
        "limiter": {"instance_count": settings.limiter.instance_count * workers},
        "server": {"ops_port": own},
    }


def _leave_with_parent(parent: int) -> None:
    """SIGTERM (a drain) when the parent dies: one killed outright (the OOM killer, `kill -9`)
    passes nothing on, and its workers, in groups of their own, would serve on as orphans beside
    the edge a supervisor starts in its place. Linux's parent-death signal; elsewhere nothing."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
            return
    if os.getppid() != parent:  # it died before the signal was asked for
        os.kill(os.getpid(), signal.SIGTERM)


_PR_SET_PDEATHSIG = 1


def _run_worker(config: str | None, overrides: dict[str, Any], parent: int, index: int) -> None:
    # Its own process group: a terminal's Ctrl-C reaches the parent only, which passes it on once
    # (a second SIGINT would force the worker's exit before its streams end cleanly).
    os.setpgrp()
    # Until the server's own handlers are in place, a Ctrl-C the parent passes on ends this worker
    # as a stop (by the signal), not as a KeyboardInterrupt traceback and exit code 1, a failure.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # blocked by the parent till now
    _leave_with_parent(parent)
    from edge.app import create_app
    from edge.config import load_settings
    from edge.gc_tuning import quiet_gc
    from edge.logging_setup import configure_logging
    from edge.server import serve
    from gpu_container.plain_logging import WORKER_ENV

    configure_logging(worker=index)
    # Inherited by the processes it starts (its engine), whose lines then name it too.
    os.environ[WORKER_ENV] = str(index)
    settings = load_settings(config, overrides)
    app = create_app(settings)
    quiet_gc()
    serve(app, settings.server, app.state.drain, reuse_port=True)


def _merged(base: dict[str, dict[str, object]], over: dict[str, dict[str, object]]) -> dict[str, Any]:
    merged: dict[str, dict[str, object]] = {k: dict(v) for k, v in base.items()}
    for section, values in over.items():
        merged.setdefault(section, {}).update(values)
    return merged


def plan_workers(
    overrides: dict[str, dict[str, object]], settings: Settings, workers: int
) -> list[dict[str, Any]]:
    """Each of `workers` workers' settings overrides, or a SystemExit saying why they cannot run.
    `serve` asks before it prepares the model and makes a dev key: asked after, a refused serve had
    printed "Try it: curl ..." for an edge that never started (and spent the model's import). So is
    a port something listens on already (edge/server.py, refuse_a_taken_port)."""
    try:
        planned = [_merged(overrides, worker_overrides(settings, workers, i)) for i in range(workers)]
    except WorkersRefused as exc:
        raise SystemExit(f"floodgate: {exc}") from None
    if workers > 1:
        # Shared by the workers, the port would be shared as silently with another edge's workers
        # serving it already: the kernel split the connections between the two.
        from edge.server import refuse_taken_ports

        # And each worker's own operator port (ops_port + i): one taken was found only by that
        # worker's bind, after the model's import and the dev key.
        server = settings.server
        refuse_taken_ports(
            [
                (server.host, server.port, ""),
                *(
                    (server.ops_host, worker["server"]["ops_port"], f"worker {i}'s ops_port")
                    for i, worker in enumerate(planned)
                ),
            ]
        )
    return planned


def serve_workers(config: str | None, per_worker: list[dict[str, Any]]) -> int:
    """Run one edge process for each of `per_worker`'s overrides (plan_workers) until a signal
    (passed on) or one of them exits; the exit code.

    Signals only note themselves (a self-pipe wakes the wait); the main loop decides what each
    means, one at a time, so a stop and a worker's own exit never race over what the workers are
    sent. The handlers are in place before the first worker starts: a SIGTERM while they start
    killed the parent (143) and left them reading a pipe it had closed."""
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    noted: collections.deque[int] = collections.deque()

    def note(sig: int, frame: FrameType | None) -> None:
        noted.append(sig)
        with contextlib.suppress(OSError):  # full: a wake is pending already
            os.write(wake_write, b"\0")

    installed = [signal.SIGTERM, signal.SIGINT]
    if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:  # `nohup floodgate serve` serves on
        installed.append(signal.SIGHUP)
    for stop in installed:
        signal.signal(stop, note)
    # spawn, not fork: a worker starts from a clean interpreter (no parent threads or loop state).
    ctx = multiprocessing.get_context("spawn")
    procs = [
        ctx.Process(target=_run_worker, args=(config, o, os.getpid(), i), name=f"floodgate-worker-{i}")
        for i, o in enumerate(per_worker)
    ]
    # Blocked while the workers start, and so in each of them from its first instruction (a signal
    # mask survives exec): a Ctrl-C passed on while a worker's interpreter starts raised
    # KeyboardInterrupt there (exit 1, a failure) before its code could say otherwise. Each
    # unblocks it once SIGINT is a stop (`_run_worker`). The resource tracker first: starting it
    # unblocks SIGINT (CPython's own use of this, bpo-33613).
    multiprocessing.resource_tracker.ensure_running()
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        for proc in procs:
            proc.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # as it was, not unblocked outright
    stops = StopSignals()
    first: BaseProcess | None = None  # the worker whose own exit stopped the others
    running = list(procs)
    while running:
        ready = multiprocessing.connection.wait([wake_read, *(proc.sentinel for proc in running)])
        if wake_read in ready:
            os.read(wake_read, 512)
        while noted:
            sig = noted.popleft()
            if stops.received(sig):
                _signal_all(procs, sig)
        ended = [proc for proc in running if proc.sentinel in ready]
        for proc in ended:
            proc.join()  # its sentinel can fire before its exit code can be read (None)
            running.remove(proc)
        if ended and first is None and not stops.asked:
            # One exited on its own (it failed, or was signalled alone): the others drain and
            # follow. Of two ended together, the one that failed.
            first = max(ended, key=lambda p: p.exitcode != 0)
            print(
                f"floodgate: {first.name} exited on its own (code {first.exitcode}); stopping the others",
                file=sys.stderr,
                flush=True,
            )
            if stops.worker_exited():
                _signal_all(procs, signal.SIGTERM)
    # Every worker is gone: a signal from now on has nothing to stop (a supervisor's late SIGTERM
    # must not end the parent with 143 or a handler's write to the closed pipe).
    for stop in installed:
        signal.signal(stop, lambda sig, frame: None)
    os.close(wake_read)
    os.close(wake_write)
    if first is not None:
        # Its code, not the SIGTERM the others then got; never 0: the edge stopped serving unasked
        # (one worker given a SIGTERM of its own drains and exits 0), and a supervisor that
        # restarts on failure (systemd's Restart=on-failure) must start it again.
        return _exit_code(first.exitcode or 1)
    # Asked to stop: a worker that died of the very signal passed on (one still starting, before
    # its handlers were in place) stopped as asked, and is no failure.
    return _exit_code(
        next((code for proc in procs if (code := proc.exitcode or 0) and -code not in _STOPS), 0)
    )


def _exit_code(code: int) -> int:
    """A worker's exit code as `serve`'s own: one killed by signal N (multiprocessing's -N) is
    128 + N, as a shell and Docker report it (137 for SIGKILL, the OOM killer's). Passed to
    sys.exit as it was, -9 came out as 247, which no supervisor or operator reads as a kill."""
    return 128 - code if code < 0 else code


# The signals the parent passes on to stop the workers.
_STOPS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class StopSignals:
    """Which of the parent's stop signals reach the workers. A worker takes its first SIGTERM as a
    drain and a second as a cut (edge/server.py), so each worker must get as many SIGTERMs as the
    parent was sent, never more: after a worker's own exit the parent sends the others one (they
    drain), and a supervisor's SIGTERM then (its first: stop the unit, which drains) is not passed
    on, or the streams the others were draining would be cut; a second one is (a cut, as asked).
    systemd's default KillMode=control-group, which signals every process of the unit, still gives
    each worker two: run it with KillMode=mixed (README)."""

    __slots__ = ("_received", "_sent", "asked")

    def __init__(self) -> None:
        self.asked = False  # the parent was told to stop (any stop signal)
        self._received = 0  # SIGTERMs the parent got
        self._sent = 0  # SIGTERMs each worker got from it

    def received(self, sig: int) -> bool:
        """The parent got `sig`: True when it must pass it on to every worker."""
        self.asked = True
        if sig != signal.SIGTERM:
            return True
        self._received += 1
        if self._received <= self._sent:
            return False
        self._sent += 1
        return True

    def worker_exited(self) -> bool:
        """A worker exited on its own: True when the others must be sent their SIGTERM now."""
        if self._sent:
            return False
        self._sent = 1
        return True


def _signal_all(procs: Sequence[BaseProcess], sig: int) -> None:
    for proc in procs:
        if proc.pid is not None and proc.exitcode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, sig)
