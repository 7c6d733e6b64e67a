"""LLMEngine in a child process, so its Python never holds the event loop's GIL: the default replica.

In one process the engine's step (scheduling, sampling, the numpy glue between BLAS calls) and the
edge's event loop take turns on one GIL: served tokens/s fell to about 60 % of the engine alone.
Here the child runs the ordinary thread-shell LLMEngine; the parent only moves small messages:

- parent -> child, one pipe: ("init", model_dir, config) once, then ("add", id, prompt, params,
  priority, cache_salt), ("abort", id), ("stop",); written from the event loop without ever
  blocking it, what a child that does not read leaves behind waiting in order (command_pipe.py).
- child -> parent, one pipe with one writer at a time: ("ready", max_model_len, stats) once, then
  per engine step ("outputs", [(id, token_ids, finish_reason, error, cached_tokens), ...], stats)
  -- every delta of a step in one message, in step order -- and ("rejected", id, message,
  own_fault) for a request the engine refused (own_fault: the request's ValueError, else the
  engine's RuntimeError).

A reader thread in the parent turns each step message into one call_soon_threadsafe per event loop,
which the edge may run through its own `run_delivery` (it holds the step's writes and writes them in
a row, edge/writes_together.py).
Cancel and disconnect send "abort" at once; the engine frees the sequence at its next step, as in
process. If the child dies, every open stream fails with UpstreamError, `running` turns false (the
edge's health checks take the replica out, /readyz fails once none is left) and the reader starts a
new child: at once if the dead one had run a minute, else after a pause that doubles while children
keep dying young or failing to load, so a replica that crashed comes back by itself, as a
supervisor would bring back a Triton server, rather than leaving the edge answering 503 forever
while its own process looks healthy.
A child that is alive but stuck (a step that never returns, a deadlock, a stopped process) is
killed once it has held requests and sent nothing for `stall_timeout_s` (the reader's watch), and
then replaced as a dead one is: its streams hung for good, and the replica, ready to the health
checks, went on taking requests that hung too (as a Triton replica silent mid-stream is failed
after its stall timeout, edge/upstreams/triton.py). Its death is dated from when it fell silent, so
that a request that hangs the engine is suspected as one that crashes it (below).
The edge is told the restart is under way, so that a crash is a short wait for its requests rather
than an error: the open streams fail with ReplicaRestarting (an UpstreamError saying the replica is
coming back), and `back_in_s` (contract.py's `Restarts`) says when, from the pause and the time the
last child took to load. A child that fails to load is not expected back: from then on until one
loads the replica is as down as any other (plain UpstreamError, `back_in_s` None).
A crash of a child that replaced a dead one less than _STABLE_S before a request reached it may be
that request's doing: a prompt that crashes the engine crashes every child it is sent to. The
request's ReplicaRestarting says so (`may_be_cause`), and the edge neither sends it back to the new
child nor invites its client to (edge/generation.py). Where some of the requests on it had been on
the dead child before too (sent back after its crash), those alone are suspected (`_blame`). A first
crash is forgiven (the first child's, or one that had served a minute): the requests it held are
sent back once, which costs a request that crashes the engine one crash more, the new child's, and
none after; a kill from outside (the OOM killer) costs them nothing. One handed over after the child
died never reached it, and is not suspected either.
What the seam's contract asks of a replica (the request's conversion, abort on close, errors) is
the engine front's (front.py), shared with the in-thread AsyncEngine.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import structlog

from gpu_container.contract import (
    Capacity,
    GenerationRequest,
    ReplicaRestarting,
    RequestRejected,
    UpstreamError,
)
from gpu_container.engine.command_pipe import CommandPipe
from gpu_container.engine.front import EngineFront
from gpu_container.engine.mailbox import Mailbox
from gpu_container.engine.types import EngineConfig, EngineStats, SamplingParams, TokenOutput
from gpu_container.plain_logging import configure_plain_logging

log = structlog.get_logger(__name__)

# (request_id, token_ids, finish_reason, error, cached_tokens): a TokenOutput as a plain tuple,
# cheap to pickle.
_Wire = tuple[str, list[int], str | None, str | None, int]
# The child's poll interval when idle: how soon it notices that its engine thread died.
_CHILD_POLL_S = 0.5
_STOP_TIMEOUT_S = 10.0
# Restarts: a child that lived this long before dying is restarted at once; one that died younger
# waits first, twice as long each time in a row, up to the cap.
_STABLE_S = 60.0
_FIRST_PAUSE_S = 0.5
_MAX_PAUSE_S = 30.0
# A child holding requests that sends nothing for this long is stuck: a step of the demo model
# takes milliseconds, a prefill chunk of a real one on a CPU seconds.
_STALL_TIMEOUT_S = 120.0
# The reader back at its watch this much later than its poll asked: its own process was not running.
_OVERSLEPT_S = 1.0
# The longest one wait for the child's messages lasts; past it the watch only looks again. poll(2)
# takes at most 2**31 - 1 ms (24.8 days): a stall_timeout_s past that (the watch set all but off)
# raised OverflowError in the reader, whose thread ended, and every request hung for good.
_POLL_AT_MOST_S = 3600.0

_Items = Sequence[tuple[Mailbox, TokenOutput]]
# Runs a step's delivery on the loop: `run_delivery(deliver, items)` must hand every item to
# `deliver` once, a delivery's items in order and after the previous delivery's (the edge's runs a
# big one a slice a loop pass, edge/writes_together.py).
RunDelivery = Callable[[Callable[[_Items], None], _Items], None]


class EngineProcess(EngineFront):
    """The parent's handle on the child, an upstream as AsyncEngine is (front.py)."""

    def __init__(
        self,
        model_dir: str | Path,
        config: EngineConfig,
        name: str = "engine",
        run_delivery: RunDelivery | None = None,
        stall_timeout_s: float = _STALL_TIMEOUT_S,
    ) -> None:
        self._model_dir = str(model_dir)
        self._config = config
        self.name = name
        self._run_delivery: RunDelivery = run_delivery or _at_once
        self._lock = threading.Lock()  # guards _mailboxes, _alive, _stopping, _back_at, _heard_at
        self._mailboxes: dict[str, Mailbox] = {}
        self._alive = False
        self._stopping = False
        self._process: subprocess.Popen[bytes] | None = None
        # Written from the event loop: never blocks, even where the child reads nothing (command_pipe.py).
        self._commands: CommandPipe | None = None
        self._events: Connection | None = None
        self._reader: threading.Thread | None = None
        self._stats: EngineStats | None = None
        self._stopped = threading.Event()  # ends a pause between restarts
        self._started_at = 0.0
        # Until then a child that dies may have been killed by a request it held: it replaced a dead
        # one less than _STABLE_S ago. 0 for the first child, whose first crash is forgiven.
        self._suspect_until = 0.0
        # The requests the last child that died held (reader thread only).
        self._last_orphans: set[str] = set()
        self._early_ends = 0  # children in a row that died young or failed to start
        # How long the last child took from its spawn to "ready": what the next restart should take.
        self._load_s = 0.0
        # While a dead child is being replaced: when the new one should serve (monotonic); else None.
        self._back_at: float | None = None
        self._stall_timeout_s = stall_timeout_s
        # When the child last sent something, or took its first request after an idle spell: the
        # watch's clock (_silent_left), which an idle child's silence does not run.
        self._heard_at = 0.0
        self.restarts = 0
        self.max_model_len = 0

    def start(self, timeout: float = 300.0) -> None:
        """Start the child and wait until its model is loaded (blocking: call via to_thread)."""
        try:
            self._spawn(timeout)
        except RuntimeError:
            self._close_pipes()  # no reader thread to close them
            raise
        self._reader = threading.Thread(target=self._read, name=f"{self.name}-reader", daemon=True)
        self._reader.start()

    def _spawn(self, timeout: float = 300.0, *, replacing: bool = False) -> None:
        """A new child, its model loaded, or RuntimeError (`replacing`: a dead one).

        A fresh interpreter (`python -m gpu_container.engine.engine_process`), not a fork: the
        parent has threads and an event loop a fork would copy mid-flight, and multiprocessing's
        spawn would re-run the parent's main script.
        """
        began = time.monotonic()
        try:
            process, commands_w, events_r = self._popen(self._config.blas_threads)
        except OSError as exc:
            # No descriptor left (EMFILE under a flood of connections), no memory to fork, the
            # interpreter gone: a failed start like any other. Raised as OSError it ended the
            # reader thread, and a replica whose child died then stayed "back in 0 s" for good.
            raise RuntimeError(f"engine process {self.name} failed to start: {exc}") from exc
        commands = CommandPipe(commands_w, self.name)
        events = Connection(events_r, writable=False)
        dead, self._commands = self._commands, commands
        if dead is not None:
            dead.close()
        with self._lock:
            self._process = process
        if self._events is not None:  # only the reader thread reads it, and it is here
            self._events.close()
        self._events = events
        message: tuple[Any, ...] = ("failed", f"no answer within {timeout:.0f} s")
        # A child already dead (killed as it started) fails the write with EPIPE, dropped: its EOF
        # comes next.
        commands.send(("init", self._model_dir, self._config))
        try:
            if events.poll(timeout):
                message = events.recv()
        except (EOFError, OSError):
            message = ("failed", f"exited during start-up (exit code {process.wait()})")
        with self._lock:
            stopping = self._stopping
            if message[0] == "ready" and not stopping:
                _, self.max_model_len, self._stats = message
                self._alive = True
                self._started_at = time.monotonic()
                self._load_s = self._started_at - began
                self._back_at = None
                self._suspect_until = self._started_at + _STABLE_S if replacing else 0.0
        if message[0] != "ready" or stopping:
            self._kill()
            raise RuntimeError(
                f"engine process {self.name} failed to start: {'stopped' if stopping else message[1]}"
            )
        log.info("engine process started", name=self.name, pid=process.pid)

    @staticmethod
    def _popen(blas_threads: int) -> tuple[subprocess.Popen[bytes], int, int]:
        """The child, and the parent's ends of its two pipes (commands to write, events to read);
        OSError leaves no descriptor open."""
        commands_r, commands_w = os.pipe()
        try:
            events_r, events_w = os.pipe()
        except OSError:
            os.close(commands_r)
            os.close(commands_w)
            raise
        try:
            process = subprocess.Popen(
                [sys.executable, "-m", __name__, str(commands_r), str(events_w)],
                pass_fds=(commands_r, events_w),
                env=_child_environment(blas_threads),
            )
        except OSError:
            os.close(commands_w)
            os.close(events_r)
            raise
        finally:
            os.close(commands_r)
            os.close(events_w)
        return process, commands_w, events_r

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    @property
    def running(self) -> bool:
        """Started, not stopped, and the child alive (a child whose engine died exits)."""
        with self._lock:
            return self._alive and not self._stopping

    def back_in_s(self) -> float | None:
        """While a dead child is being replaced: about how long until the new one serves (0 once
        overdue). None while one serves, once stopped, or after a new child failed to load."""
        with self._lock:
            back_at = None if self._stopping else self._back_at
        return None if back_at is None else max(0.0, back_at - time.monotonic())

    def stats(self) -> EngineStats:
        if self._stats is None:
            raise RuntimeError("engine process is not started")
        return self._stats

    async def capacity(self) -> Capacity:
        return dataclasses.replace(await super().capacity(), restarts=self.restarts)

    def _submit(self, req: GenerationRequest, params: SamplingParams, mailbox: Mailbox) -> None:
        with self._lock:
            if not self._alive or self._stopping:
                back_at = None if self._stopping else self._back_at
                if back_at is not None:
                    # Placed in the moment before the edge's health check saw the child die.
                    raise ReplicaRestarting(
                        "engine process is restarting",
                        max(0.0, back_at - time.monotonic()),
                        may_be_cause=False,
                    )
                raise RuntimeError("engine process is not running")
            if self._process is not None and self._process.poll() is not None:
                # Dead, and its reader not there yet: a request written down its pipe now would fail
                # with the requests the child held, as one that may have killed it.
                raise ReplicaRestarting(
                    "engine process exited", self._pause_ahead() + self._load_s, may_be_cause=False
                )
            if req.request_id in self._mailboxes:
                raise ValueError(f"request {req.request_id!r} is already running")
            now = time.monotonic()
            mailbox.may_be_cause = now < self._suspect_until
            if not self._mailboxes:
                self._heard_at = now
            self._mailboxes[req.request_id] = mailbox
        prompt = [int(t) for t in req.prompt_ids]
        self._send(("add", req.request_id, prompt, params, req.priority, req.cache_salt))

    def abort(self, request_id: str) -> None:
        """Forget the request here and have the child free it at its next step."""
        with self._lock:
            known = self._mailboxes.pop(request_id, None) is not None and self._alive
        if known:
            self._send(("abort", request_id))

    def stop(self) -> None:
        """Cancel every request, end the child (killed if it does not exit in time). Idempotent."""
        with self._lock:
            if self._stopping or self._process is None:
                self._stopping = True
                return
            self._stopping = True
            alive, process = self._alive, self._process
        self._stopped.set()
        if alive:
            self._send(("stop",))
        else:  # dead, or a restart loading its model: nothing to wait for
            self._kill()
        try:
            process.wait(timeout=_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            log.warning("engine process ignored stop; killing it", name=self.name)
            self._kill()
        if self._reader is not None and self._reader is not threading.current_thread():
            self._reader.join(timeout=_STOP_TIMEOUT_S)

    def _send(self, message: tuple[Any, ...]) -> None:
        """Never blocks (a stuck child's commands wait in its pipe's backlog); a child that is gone
        is noticed by the reader, not here."""
        commands = self._commands
        assert commands is not None
        commands.send(message)

    def _close_pipes(self) -> None:
        """Close the last child's pipes: left to garbage collection, two descriptors stayed open for
        each EngineProcess stopped."""
        if self._commands is not None:
            self._commands.close()
        if self._events is not None:
            self._events.close()

    def _kill(self) -> bool:
        """SIGKILL the child and reap it; False where it had not exited _STOP_TIMEOUT_S later: stuck
        in the kernel (a hung read of its model's file, a driver), where the kill lands only once
        that returns. Raised, the timeout ended the reader thread, and a stuck child's streams hung
        for good on a replica that stayed ready and was never replaced."""
        process = self._process
        if process is None or process.poll() is not None:
            return True
        process.kill()
        try:
            process.wait(timeout=_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            log.error("engine process outlived its kill", name=self.name, pid=process.pid)
            return False
        return True

    def _read(self) -> None:
        """The reader thread: each child's messages until it exits, then a new child unless stopped."""
        try:
            while True:
                died_at = self._read_child()
                # Read before the pause resets it: a child that served a minute died a forgiven
                # death, whatever its requests' marks at submit said.
                stable = died_at - self._started_at >= _STABLE_S
                pause = self._pause_before_restart()
                self._fail_all(pause, stable)
                if not self._restart(pause):
                    return
        finally:
            self._close_pipes()  # here, the events' only reader: stop() may have given up joining us

    def _read_child(self) -> float:
        """The child's messages until it exits; returns when it stopped serving: its exit, or, for
        one killed as stuck, when it fell silent. Dated from its kill, a stuck child had always
        served _STABLE_S (stall_timeout_s is longer): a request that hangs the engine was never
        suspected, and was sent back to hang each new child for stall_timeout_s more."""
        assert self._events is not None
        events = self._events
        looked, asked = time.monotonic(), 0.0
        silent_since: float | None = None
        while True:
            now = time.monotonic()
            if now - looked > asked + _OVERSLEPT_S:
                self._restart_clock()
            looked = now
            left = self._silent_left()
            if left is not None and left <= 0:
                log.error("engine process stuck; killing it", name=self.name, silent_s=self._stall_timeout_s)
                with self._lock:
                    silent_since = self._heard_at
                if not self._kill():
                    return silent_since  # its pipe's EOF may never come: replaced as a dead child is
                # Else its pipe's EOF comes next: replaced as a dead child is.
            asked = min(self._stall_timeout_s if left is None else max(left, 0.0), _POLL_AT_MOST_S)
            try:
                if not events.poll(asked):
                    continue
                message = events.recv()
            except (EOFError, OSError):
                return time.monotonic() if silent_since is None else silent_since
            with self._lock:
                self._heard_at = time.monotonic()
            if message[0] == "outputs":
                self._stats = message[2]
                self._dispatch(message[1])
            elif message[0] == "rejected":
                with self._lock:
                    mailbox = self._mailboxes.pop(message[1], None)
                if mailbox is not None:
                    _, _, text, own_fault = message
                    mailbox.post_exception(RequestRejected(text) if own_fault else UpstreamError(text))

    def _restart_clock(self) -> None:
        """This thread came back to its watch long past its time (a poll's timeout, or a message's
        few microseconds): the edge's process did not run meanwhile (stopped whole, by Ctrl-Z or a
        frozen container, and its child, of the same process group, with it). The child's silence
        was the edge's own: counted, the reader, woken first, killed a child serving as it should
        the moment both were continued."""
        with self._lock:
            self._heard_at = time.monotonic()

    def _silent_left(self) -> float | None:
        """Seconds the child may stay silent before it counts as stuck; None while it holds no
        request (an idle child sends nothing)."""
        with self._lock:
            if not self._mailboxes:
                return None
            return self._heard_at + self._stall_timeout_s - time.monotonic()

    def _pause_before_restart(self) -> float:
        """0 after a child that ran a minute; else the next of the doubling pauses."""
        if time.monotonic() - self._started_at >= _STABLE_S:
            self._early_ends = 0
            return 0.0
        return self._next_pause()

    def _pause_ahead(self) -> float:
        """The pause `_pause_before_restart` would choose if the child died now (it changes nothing)."""
        if time.monotonic() - self._started_at >= _STABLE_S:
            return 0.0
        return _pause(self._early_ends)

    def _restart(self, pause: float) -> bool:
        """A new child in the dead one's place, after `pause` (False: stopped meanwhile). See the
        module doc."""
        while not self._stopped.wait(pause):
            try:
                self._spawn(replacing=True)
            except RuntimeError as exc:
                log.error("engine process restart failed", name=self.name, error=str(exc))
                with self._lock:
                    self._back_at = None  # down for a reason a restart did not mend: not expected back
                pause = self._next_pause()
                continue
            self.restarts += 1
            log.warning("engine process restarted", name=self.name, restarts=self.restarts)
            return True
        return False

    def _next_pause(self) -> float:
        """After a child that died young or failed to start: twice the last pause, capped."""
        pause = _pause(self._early_ends)
        self._early_ends += 1
        return pause

    def _dispatch(self, wire: list[_Wire]) -> None:
        """Hand one step's outputs to their mailboxes."""
        items = []
        with self._lock:
            for request_id, token_ids, finish_reason, error, cached_tokens in wire:
                mailboxes = self._mailboxes
                mailbox = (
                    mailboxes.get(request_id) if finish_reason is None else mailboxes.pop(request_id, None)
                )
                if mailbox is not None:
                    output = TokenOutput(request_id, token_ids, finish_reason, error, cached_tokens)  # type: ignore[arg-type]
                    items.append((mailbox, output))
        self._hand_over(items)

    def _hand_over(
        self, items: list[tuple[Mailbox, TokenOutput]], deliver: Callable[[_Items], None] | None = None
    ) -> None:
        """One wake-up per event loop for a whole step, not one per token (`deliver`: `_deliver`
        unless said)."""
        deliver = deliver or _deliver
        batches: dict[asyncio.AbstractEventLoop, list[tuple[Mailbox, TokenOutput]]] = {}
        for mailbox, output in items:
            batches.setdefault(mailbox.loop, []).append((mailbox, output))
        for loop, batch in batches.items():
            try:
                loop.call_soon_threadsafe(self._run_delivery, deliver, batch)
            except RuntimeError:
                # That event loop is closed: nobody is left to read, so stop spending steps on it.
                for _, output in batch:
                    self.abort(output.request_id)

    def _blame(self, orphans: dict[str, Mailbox], stable: bool) -> None:
        """Which requests of a dead child may be what killed it (Mailbox.may_be_cause, set at
        submit where the child had replaced a dead one less than _STABLE_S before): none where the
        child had served _STABLE_S by its death (a request that reached it young and was still on
        it then was failed final before, though the crash was forgiven); else, of those marked, the
        ones the last child to die with requests open held too (sent back after its death: the
        same id) where there are any; else all. A request that merely came to the new child beside
        ones sent back to it is sent back once itself, not failed for them."""
        repeated = orphans.keys() & self._last_orphans
        if stable:
            for mailbox in orphans.values():
                mailbox.may_be_cause = False
        elif repeated:
            for request_id, mailbox in orphans.items():
                mailbox.may_be_cause = mailbox.may_be_cause and request_id in repeated
        self._last_orphans = set(orphans)

    def _fail_all(self, pause: float, stable: bool = False) -> None:
        """The child is gone: every open stream ends with an error instead of hanging, and unless
        stopped, with ReplicaRestarting: a new child is expected after `pause` and a load as long as
        the last one's. Marked restarting in the same step as not alive, so that nobody sees the
        replica down without seeing it come back."""
        code = None
        if self._process is not None:
            try:
                code = self._process.wait(timeout=_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                pass
        back_at = time.monotonic() + pause + self._load_s
        with self._lock:
            self._alive = False
            stopping = self._stopping
            if not stopping:
                self._back_at = back_at
            orphans, self._mailboxes = self._mailboxes, {}
        reason = "stopped" if stopping else f"exited unexpectedly (exit code {code})"
        if orphans and not stopping:
            log.error("engine process died with requests open", name=self.name, exitcode=code)
            self._blame(orphans, stable)
        self._hand_over(
            [
                (mailbox, TokenOutput(request_id, [], "error", f"engine process {reason}"))
                for request_id, mailbox in orphans.items()
            ],
            None if stopping else functools.partial(_deliver_restarting, back_at),
        )


def _child_environment(blas_threads: int) -> dict[str, str] | None:
    """The child's environment: the engine's BLAS thread count set before numpy loads BLAS. The
    engine caps the pool at start (blas_threads.py), but OpenBLAS has by then started its default
    pool, a thread per core, and its buffers: numpy's import took 0.16 s of CPU against 0.08 with
    one thread, of a child's 0.3 s up to "ready" (2-core Xeon). 0 leaves BLAS alone, as the engine
    does."""
    if blas_threads <= 0:
        return None
    threads = str(blas_threads)
    return {
        **os.environ,
        "OPENBLAS_NUM_THREADS": threads,
        "OMP_NUM_THREADS": threads,
        "MKL_NUM_THREADS": threads,
    }


def _pause(early_ends: int) -> float:
    """The pause before a restart after `early_ends` children in a row died young or failed to load."""
    return min(_FIRST_PAUSE_S * float(2 ** min(early_ends, 16)), _MAX_PAUSE_S)


def _deliver(items: _Items) -> None:
    """On the event loop: one step's outputs into their mailboxes."""
    for mailbox, output in items:
        mailbox.put(output)


def _deliver_restarting(back_at: float, items: _Items) -> None:
    """On the event loop: the streams of a child that died, failed as coming back by `back_at`
    (in step order, after the outputs it sent before it died), each saying whether it may be what
    killed it."""
    back_in_s = max(0.0, back_at - time.monotonic())
    for mailbox, output in items:
        error = output.error or "engine process died"
        mailbox.fail(ReplicaRestarting(error, back_in_s, may_be_cause=mailbox.may_be_cause))


def _at_once(deliver: Callable[[_Items], None], items: _Items) -> None:
    deliver(items)


def serve_engine(commands: Connection, events: Connection) -> None:
    """The child's main: load the model, run the engine thread, apply commands until told to stop."""
    # Ctrl-C in a terminal, a closed terminal's SIGHUP, and SIGTERM from systemd
    # (KillMode=control-group) or `timeout`, reach the whole process group; the parent decides when
    # the engine stops, after its drain: it sends "stop", kills with SIGKILL if that is ignored, and
    # a parent that dies closes the pipe (EOF ends us).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    # JSON lines like the edge's, and never structlog's default console tracebacks with locals (a
    # frame of the engine holds prompt token ids and KV-cache arrays).
    configure_plain_logging()
    from gpu_container.engine.engine import LLMEngine

    send_lock = threading.Lock()
    pending: list[_Wire] = []

    def send(message: tuple[Any, ...]) -> None:
        with send_lock:
            try:
                events.send(message)
            except OSError:
                pass  # the parent is gone; the command loop sees EOF and exits

    def collect(output: TokenOutput) -> None:
        pending.append(
            (output.request_id, output.token_ids, output.finish_reason, output.error, output.cached_tokens)
        )

    def flush(stats: EngineStats) -> None:
        batch = pending[:]
        pending.clear()
        send(("outputs", batch, stats))

    try:
        _, model_dir, config = commands.recv()
        engine = LLMEngine.from_pretrained(model_dir, config, on_published=flush)
        engine.start()
    except Exception as exc:
        send(("failed", f"{type(exc).__name__}: {exc}"))
        return
    send(("ready", engine.max_model_len, engine.stats()))
    try:
        while engine.running:
            if not commands.poll(_CHILD_POLL_S):
                continue
            try:
                message = commands.recv()
            except (EOFError, OSError):
                break  # the parent died or closed the pipe
            kind = message[0]
            if kind == "add":
                _, request_id, prompt, params, priority, cache_salt = message
                try:
                    engine.add_request(request_id, prompt, params, collect, priority, cache_salt)
                except ValueError as exc:
                    send(("rejected", request_id, str(exc), True))
                except RuntimeError as exc:
                    send(("rejected", request_id, str(exc), False))
            elif kind == "abort":
                engine.abort(message[1])
            elif kind == "stop":
                break
    finally:
        engine.stop()


if __name__ == "__main__":
    serve_engine(Connection(int(sys.argv[1]), writable=False), Connection(int(sys.argv[2]), readable=False))
