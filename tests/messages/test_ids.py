"""Message ids sort in creation order, even within one millisecond."""

from __future__ import annotations

from edge.messages.ids import MessageIdGenerator


def test_ids_sort_by_time_and_within_a_millisecond() -> None:
    gen = MessageIdGenerator()
    same_ms = [gen.new_id(now_ms=1_700_000_000_000) for _ in range(50)]
    later = gen.new_id(now_ms=1_700_000_000_001)

    assert sorted(same_ms) == same_ms
    assert len(set(same_ms)) == 50
    assert later > same_ms[-1]
    assert all(len(i) == 26 for i in [*same_ms, later])


def test_a_clock_step_backwards_keeps_ids_increasing() -> None:
    gen = MessageIdGenerator()
    first = gen.new_id(now_ms=2_000_000)
    after_step_back = gen.new_id(now_ms=1_000_000)

    assert after_step_back > first
