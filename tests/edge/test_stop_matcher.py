"""Stop strings found across delta boundaries, with nothing of them ever emitted."""

from __future__ import annotations

import random

import pytest

from edge.text import stops as stops_module
from edge.text.stops import SHORT_STOP, StopMatcher


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


@pytest.mark.parametrize(
    ("stops", "deltas", "expected"),
    [
        (["END"], ["Hello ", "EN", "D there"], "Hello END"),
        (["END"], ["HelloEND more"], "HelloEND"),
        (["world", "lo w"], ["hello world"], "hello w"),  # the earliest, whole
        (["x" * (SHORT_STOP + 8)], ["ab", "x" * 30, "x" * 30, "tail"], "ab" + "x" * (SHORT_STOP + 8)),
    ],
)
def test_include_stop_str_in_output_keeps_the_stop_string_and_cuts_after_it(
    stops: list[str], deltas: list[str], expected: str
) -> None:
    """vLLM's include_stop_str_in_output: the reply ends at the same place, with its stop string."""
    matcher = StopMatcher(stops, include=True)
    out = ""
    for delta in deltas:
        text, stopped = matcher.feed(delta)
        out += text
        if stopped:
            break
    assert (out, stopped) == (expected, True)


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


def _longest_held(text: str, stops: list[str]) -> int:
    """The longest tail of `text` that is a proper prefix of a stop string, tail by tail."""
    return max((n for s in stops for n in range(1, len(s)) if text.endswith(s[:n])), default=0)


@pytest.mark.parametrize("seed", range(40))
def test_long_and_short_stops_hold_and_cut_as_the_plain_definition_says(seed: int) -> None:
    """Stop strings past SHORT_STOP take the linear path (edge/text/stops.py); on text of two
    letters, where a reply keeps following and leaving them, they hold back and cut exactly what
    the plain definition does: every tail that may begin a stop string held, the reply cut where
    the first stop string found begins."""
    rng = random.Random(seed)

    def word(length: int) -> str:
        return "".join(rng.choice("ab") for _ in range(length))

    period = word(rng.randint(1, 4))
    stops = [
        (period * 40)[: rng.randint(SHORT_STOP + 1, 80)] + word(rng.randint(0, 3)),
        word(rng.randint(1, 6)),
    ]
    stops += [word(rng.randint(SHORT_STOP + 1, 60))] if seed % 2 else []
    matcher = StopMatcher(stops)
    received = emitted = ""
    for _ in range(300):
        chunk = (period * 3)[: rng.randint(1, 5)] if rng.random() < 0.8 else word(rng.randint(1, 5))
        received += chunk
        text, stopped = matcher.feed(chunk)
        emitted += text
        if stopped:
            assert emitted == received[: min(i for i in (received.find(s) for s in stops) if i >= 0)]
            return
        assert not any(s in received for s in stops)
        assert emitted == received[: len(received) - _longest_held(received, stops)]
    assert emitted + matcher.flush() == received


def test_a_long_stop_string_followed_to_its_last_character_then_left_is_sent_whole() -> None:
    """16,000 characters held back, then sent at once when the reply leaves the stop string."""
    stop = "ab" * 8000 + "Z"
    matcher = StopMatcher([stop])
    for i in range(0, len(stop) - 1, 4):
        assert matcher.feed(stop[i : min(i + 4, len(stop) - 1)]) == ("", False)
    assert matcher.feed("Q") == (stop[:-1] + "Q", False)


@pytest.mark.parametrize("seed", range(40))
def test_the_linear_path_answers_as_the_tail_by_tail_one_with_min_tokens(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same stop strings and deltas through both paths (every string tail by tail, as before the
    linear one): the same answer to every delta, with whole stop strings sent as text before
    min_tokens and found again from their overlap after it."""
    rng = random.Random(seed)
    period = "".join(rng.choice("ab") for _ in range(rng.randint(1, 3)))
    stops = [(period * 40)[: rng.randint(SHORT_STOP + 1, 60)], "".join(rng.choice("ab") for _ in range(5))]
    linear = StopMatcher(stops, min_tokens=rng.randint(1, 40))
    monkeypatch.setattr(stops_module, "SHORT_STOP", 10**9)
    tail_by_tail = StopMatcher(stops, min_tokens=linear._min_tokens)
    for tokens in range(1, 200):
        chunk = (period * 3)[: rng.randint(1, 5)] if rng.random() < 0.9 else rng.choice("ab")
        answer = linear.feed(chunk, tokens)
        assert answer == tail_by_tail.feed(chunk, tokens)
        if answer[1]:
            return
    assert linear.flush() == tail_by_tail.flush()


def test_a_stop_that_ended_before_min_tokens_inside_the_start_of_a_longer_one_is_not_found_later() -> None:
    # "ab" ended before min_tokens, and is held as the possible start of "abcd".
    matcher = StopMatcher(["ab", "abcd"], min_tokens=2)
    assert matcher.feed("xab", 1) == ("x", False)
    assert matcher.feed("x", 2) == ("abx", False)
    assert matcher.feed("ab", 3) == ("", True)
