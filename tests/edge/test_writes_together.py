"""edge/writes_together.py: a delivery callback's chunk writes go out after its relays, in their
order, at most HOLD_MAX held at a time, and never held for another thread or lost to an error; on a
loop, a big delivery runs SLICE streams a pass, in the order deliveries came."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from structlog.testing import capture_logs

from edge import writes_together
from edge.writes_together import HOLD_MAX, SLICE, write
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


async def _passes(n: int) -> None:
    """Let the loop run `n` passes: the test's task yields, and runs again after what is ready."""
    for _ in range(n):
        await asyncio.sleep(0)


def _relaying(log: list[Any], name: str) -> Callable[[Sequence[int]], None]:
    """A delivery to streams numbered by its items: each relay logs itself and writes a chunk."""

    def deliver(streams: Sequence[int]) -> None:
        for i in streams:
            log.append(f"relay {name}{i}")
            write(_logging(log, f"write {name}{i}"), b"x")

    return deliver


@pytest.mark.anyio
async def test_a_big_delivery_lets_the_loop_run_other_callbacks_between_its_slices() -> None:
    """A step of many streams must not hold the loop for all of them: what the loop got meanwhile
    (a new request's head, a Redis reply) runs after one more slice, not after the whole step."""
    loop = asyncio.get_running_loop()
    log: list[Any] = []
    hold(_relaying(log, "s"), range(SLICE * 2 + 1))
    assert log[-1] == f"write s{SLICE - 1}"  # the first slice relayed and written at once
    loop.call_soon(log.append, "another callback")
    await _passes(2)  # a slice a pass
    relays = [entry for entry in log if entry.startswith("relay") or entry == "another callback"]
    assert relays == [
        *(f"relay s{i}" for i in range(SLICE * 2)),
        "another callback",
        f"relay s{SLICE * 2}",
    ]
    # Each slice's writes go out at its end, in the relays' order.
    writes = [entry for entry in log if entry.startswith("write")]
    assert writes == [f"write s{i}" for i in range(SLICE * 2 + 1)]
    assert log.index(f"write s{SLICE * 2 - 1}") < log.index("another callback")


@pytest.mark.anyio
async def test_a_delivery_behind_slices_waits_for_them_so_a_streams_tokens_keep_their_order() -> None:
    log: list[Any] = []
    hold(_relaying(log, "step1 "), range(SLICE + 1))
    hold(_relaying(log, "step2 "), [SLICE])  # one item, the stream the first step has yet to relay
    assert f"relay step2 {SLICE}" not in log
    await _passes(2)
    assert log.index(f"write step1 {SLICE}") < log.index(f"relay step2 {SLICE}")


@pytest.mark.anyio
async def test_a_slice_that_raises_goes_to_the_loops_handler_and_the_rest_still_run() -> None:
    loop = asyncio.get_running_loop()
    errors: list[BaseException | None] = []
    loop.set_exception_handler(lambda _loop, context: errors.append(context.get("exception")))
    relayed: list[int] = []

    def deliver(streams: Sequence[int]) -> None:
        relayed.extend(streams)
        if SLICE in streams:
            raise RuntimeError("a relay broke")

    try:
        hold(deliver, range(SLICE * 3))
        await _passes(2)
    finally:
        loop.set_exception_handler(None)
    assert relayed == list(range(SLICE * 3))
    assert [type(e) for e in errors] == [RuntimeError]


def test_a_loop_closed_with_slices_left_is_forgotten_by_the_next_delivery() -> None:
    """Its passes will never run: kept waiting, it would make every delivery after it look its
    loop up, and hold its streams' relays for good."""
    log: list[Any] = []
    closed = asyncio.new_event_loop()

    async def deliver_a_big_step() -> None:
        hold(_relaying(log, "s"), range(SLICE * 4))

    closed.run_until_complete(deliver_a_big_step())
    closed.close()
    assert writes_together._waiting  # slices were left when it closed
    relayed_before = len(log)

    delivered: list[int] = []
    hold(delivered.extend, [1])
    assert delivered == [1]
    assert not writes_together._waiting
    assert len(log) == relayed_before  # nothing of the closed loop's ran elsewhere
