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


def test_an_id_made_after_another_sorts_after_it_whatever_the_clock() -> None:
    """Another edge's id, from a clock ahead of this one's: the next turn's id still sorts after it."""
    ahead = MessageIdGenerator().new_id(now_ms=2_000_000)
    behind = MessageIdGenerator()
    made = [behind.new_id(now_ms=1_000_000, after=ahead) for _ in range(50)]
    assert all(m > ahead for m in made)
    assert len(set(made)) == 50
    # The last id of a millisecond (its random part all ones): the next one is in the next.
    last_of_ms = ahead[:10] + "Z" * 16
    assert behind.new_id(now_ms=1_000_000, after=last_of_ms) > last_of_ms
