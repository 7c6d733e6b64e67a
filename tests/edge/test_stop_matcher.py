"""Stop strings found across delta boundaries, with nothing of them ever emitted."""

from __future__ import annotations

import pytest

from edge.text.stops import StopMatcher


def _run(stops: list[str], deltas: list[str]) -> tuple[str, bool, list[str]]:
    matcher = StopMatcher(stops)
    out: list[str] = []
    for delta in deltas:
        text, stopped = matcher.feed(delta)
        out.append(text)
        if stopped:
            return "".join(out), True, out
    out.append(matcher.flush())
    return "".join(out), False, out


@pytest.mark.parametrize(
    ("deltas", "expected"),
    [
        (["Hello ", "EN", "D there"], "Hello "),
        (["Hello E", "N", "D"], "Hello "),
        (["HelloEND"], "Hello"),
        (["ENDgame"], ""),
    ],
)
def test_stop_across_deltas(deltas: list[str], expected: str) -> None:
    text, stopped, _ = _run(["END"], deltas)
    assert (text, stopped) == (expected, True)


def test_possible_prefix_is_held_then_released() -> None:
    text, stopped, pieces = _run(["END"], ["abc E", "N", "x", "yz"])
    assert not stopped and text == "abc ENxyz"
    assert pieces[0] == "abc " and pieces[1] == ""  # "E", then "EN", held back as a possible stop


def test_earliest_of_several_stops_wins() -> None:
    text, stopped, _ = _run(["world", "lo w"], ["hello world"])
    assert (text, stopped) == ("hel", True)


def test_unfinished_prefix_is_flushed_at_the_end() -> None:
    text, stopped, _ = _run(["<stop>"], ["answer <st"])
    assert (text, stopped) == ("answer <st", False)


def test_no_stops_passes_text_through() -> None:
    matcher = StopMatcher([])
    assert not matcher.active
    assert matcher.feed("anything") == ("anything", False)


def test_a_stop_string_before_min_tokens_is_sent_as_text() -> None:
    # As vLLM's min_tokens: a stop ending in the text of the reply's first tokens does not end it.
    matcher = StopMatcher(["END"], min_tokens=3)
    assert matcher.feed("one END", 1) == ("one END", False)
    assert matcher.feed(" two", 2) == (" two", False)
    assert matcher.feed(" END three", 3) == (" ", True)


def test_a_stop_begun_before_min_tokens_and_ended_after_it_counts() -> None:
    matcher = StopMatcher(["END"], min_tokens=2)
    assert matcher.feed("one EN", 1) == ("one ", False)  # held as a possible stop, as without a minimum
    assert matcher.feed("D", 2) == ("", True)


def test_a_stop_that_ended_before_min_tokens_is_not_found_later() -> None:
    matcher = StopMatcher(["END"], min_tokens=2)
    assert matcher.feed("END", 1) == ("END", False)
    assert matcher.feed(" more", 2) == (" more", False)
