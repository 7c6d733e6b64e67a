"""An asyncio event loop whose clock stands still while anything is ready to run and jumps to the
next timer when nothing is: minutes of a periodic task's schedule in milliseconds, each wake-up at
exactly the time it was scheduled for. A test moves the clock on by hand too (`advance`), from any
thread: a call that takes time, where real time is not spent on it.

    loop = VirtualClockLoop()
    try:
        loop.run_until_complete(main())
    finally:
        loop.close()

Only timers move the clock: a task that waits on a thread (to_thread) with no timer due lets the
loop block on its selector as usual, so the clock stands still for the thread's real duration; with
a timer due, the clock jumps to it at once (`hold` stops the jumps).
"""

from __future__ import annotations

import asyncio
import threading


class VirtualClockLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        super().__init__()
        self._now = 0.0
        self._lock = threading.Lock()
        self._jumping = True

    def time(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += seconds

    def hold(self) -> None:
        """No more jumps: the clock moves only by `advance`. A task that waits on a thread with a
        timer pending (a close's budget) would otherwise see the timer fire at once."""
        self._jumping = False

    def _run_once(self) -> None:
        # CPython's loop: _ready holds the callbacks due now, _scheduled the timers, earliest first.
        ready: object = self._ready  # type: ignore[attr-defined]
        scheduled: list[asyncio.TimerHandle] = self._scheduled  # type: ignore[attr-defined]
        due = [timer.when() for timer in scheduled if not timer.cancelled()]
        if self._jumping and not ready and due:
            with self._lock:
                self._now = max(self._now, min(due))
        super()._run_once()  # type: ignore[misc]
