"""edge/writes_together.py: a delivery callback's chunk writes go out after its relays, in their
order, at most HOLD_MAX held at a time, and never held for another thread or lost to an error."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from structlog.testing import capture_logs

from edge import writes_together
from edge.writes_together import HOLD_MAX, write
from edge.writes_together import writes_together as hold


def _hold(run: Callable[[], None]) -> None:
    """`run` as a delivery to two streams, which opens a hold."""
    hold(lambda _streams: run(), ["a", "b"])


def _logging(log: list[Any], entry: Any) -> Callable[[bytes], None]:
    """A stream's writer: it logs `entry` when its chunk is written."""

    def writer(_chunk: bytes) -> None:
        log.append(entry)

    return writer


def test_writes_in_a_hold_go_out_when_it_ends_in_their_order() -> None:
    log: list[str] = []

    def run() -> None:
        for stream in ("a", "b", "a"):
            log.append(f"relay {stream}")
            write(_logging(log, f"write {stream}"), b"x")

    _hold(run)
    assert log == ["relay a", "relay b", "relay a", "write a", "write b", "write a"]


def test_without_a_hold_a_write_goes_out_at_once() -> None:
    written: list[bytes] = []
    write(written.append, b"now")
    assert written == [b"now"]


def test_a_delivery_to_one_stream_holds_nothing() -> None:
    """One write has nothing to be written with: a hold would only cost its own upkeep."""
    log: list[str] = []

    def deliver(streams: Sequence[str]) -> None:
        write(_logging(log, f"write {streams[0]}"), b"x")
        log.append("relay done")

    hold(deliver, ["a"])
    assert log == ["write a", "relay done"]


def test_a_long_delivery_writes_every_hold_max_chunks_not_only_at_its_end() -> None:
    written: list[int] = []
    seen_during: list[int] = []

    def run() -> None:
        for i in range(HOLD_MAX * 2 + 3):
            write(_logging(written, i), b"x")
            seen_during.append(len(written))

    _hold(run)
    assert seen_during[HOLD_MAX - 2] == 0
    assert seen_during[HOLD_MAX - 1] == HOLD_MAX  # the HOLD_MAX-th write flushed the hold
    assert seen_during[-1] == HOLD_MAX * 2
    assert written == list(range(HOLD_MAX * 2 + 3))


def test_a_hold_inside_a_hold_leaves_its_writes_to_the_outer_one() -> None:
    log: list[str] = []

    def inner() -> None:
        write(lambda _c: log.append("inner write"), b"x")
        log.append("inner end")

    def outer() -> None:
        _hold(inner)
        log.append("outer end")

    _hold(outer)
    assert log == ["inner end", "outer end", "inner write"]


def test_a_delivery_that_raises_still_writes_what_it_held() -> None:
    written: list[bytes] = []

    def run() -> None:
        write(written.append, b"kept")
        raise RuntimeError("relay broke")

    with pytest.raises(RuntimeError, match="relay broke"):
        _hold(run)
    assert written == [b"kept"]
    assert writes_together.open_hold is None  # the next delivery holds afresh


def test_one_write_that_raises_costs_no_other_stream_its_write_nor_the_relay_its_run() -> None:
    """A transport refusing a write is its own client gone (its stream learns that from the
    connection's loss): the relay that filled the hold, and the delivery, go on."""
    written: list[bytes] = []
    relays_done: list[int] = []

    def broken(_chunk: bytes) -> None:
        raise RuntimeError("the transport is closed")

    def run() -> None:
        write(written.append, b"before")
        write(broken, b"lost")
        for i in range(HOLD_MAX):  # the hold fills and is written inside this relay
            write(written.append, b"after")
            relays_done.append(i)

    with capture_logs() as logs:
        _hold(run)
    assert written == [b"before"] + [b"after"] * HOLD_MAX
    assert relays_done == list(range(HOLD_MAX))
    assert [entry["event"] for entry in logs] == ["held_write_failed"]


def test_another_threads_write_during_a_hold_goes_out_at_once() -> None:
    """A second event loop in another thread (a test's server) writes its own streams' chunks; the
    hold's flush runs on the thread that opened it and must not write them there, later."""
    log: list[str] = []

    def other_thread() -> None:
        write(lambda _c: log.append("other thread's write"), b"x")

    def run() -> None:
        write(lambda _c: log.append("held write"), b"x")
        thread = threading.Thread(target=other_thread)
        thread.start()
        thread.join()
        log.append("relays done")

    _hold(run)
    assert log == ["other thread's write", "relays done", "held write"]
