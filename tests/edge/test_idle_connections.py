"""Which idle connection the connection cap takes for a new client (edge/idle_connections.py): the
oldest, and only once idle `idle_reclaim_after_s`. The loop's clock is passed in, so the grace is
exact here; tests/edge/test_connection_cap.py takes them on a real server."""

from __future__ import annotations

from edge.idle_connections import IdleConnections


class _Transport:
    """The one part of an asyncio transport the set reads and calls."""

    def __init__(self) -> None:
        self.closed = False

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True


class _Connection:
    def __init__(self) -> None:
        self.transport = _Transport()


def test_the_oldest_idle_long_enough_is_closed_and_a_younger_one_never() -> None:
    idle = IdleConnections(1.0)
    old, newer, young = _Connection(), _Connection(), _Connection()
    idle.add(old, 10.0)
    idle.add(newer, 10.5)
    idle.add(young, 11.2)
    assert idle.close_oldest(11.6)
    assert (old.transport.closed, newer.transport.closed) == (True, False)
    # The next oldest has been idle 1.1 s; the one after it 0.4 s.
    assert idle.close_oldest(11.6)
    assert newer.transport.closed
    assert not idle.close_oldest(11.6)
    assert not young.transport.closed
    assert idle.close_oldest(12.2) and young.transport.closed
    assert len(idle) == 0 and not idle.close_oldest(100.0)


def test_a_connection_idle_again_goes_to_the_end_and_one_in_use_is_never_taken() -> None:
    idle = IdleConnections(0.0)
    first, second = _Connection(), _Connection()
    idle.add(first, 1.0)
    idle.add(second, 2.0)
    idle.add(first, 3.0)  # answered again: idle from now
    assert idle.close_oldest(3.0) and second.transport.closed and not first.transport.closed
    idle.discard(first)  # its next request began
    assert not idle.close_oldest(3.0) and not first.transport.closed


def test_one_closing_already_is_passed_over() -> None:
    idle = IdleConnections(0.0)
    closing, open_one = _Connection(), _Connection()
    idle.add(closing, 1.0)
    idle.add(open_one, 2.0)
    closing.transport.close()
    assert idle.close_oldest(5.0) and open_one.transport.closed
