"""The outbox between the engine thread and the response sender."""

from __future__ import annotations

import threading

from gpu_container.engine.types import TokenOutput
from gpu_container.triton.cpu.outbox import Outbox


def test_outputs_of_one_request_merge_until_taken() -> None:
    box = Outbox()
    box.post(TokenOutput("a", [1]))
    box.post(TokenOutput("b", [7]))
    box.post(TokenOutput("a", [2, 3]))
    box.post(TokenOutput("a", [], "length"))
    assert box.take() == [TokenOutput("a", [1, 2, 3], "length"), TokenOutput("b", [7])]
    box.post(TokenOutput("b", [8], "stop"))
    assert box.take() == [TokenOutput("b", [8], "stop")]


def test_an_error_survives_merging() -> None:
    box = Outbox()
    box.post(TokenOutput("a", [1]))
    box.post(TokenOutput("a", [], "error", "boom"))
    assert box.take() == [TokenOutput("a", [1], "error", "boom")]


def test_the_prefix_cache_hit_of_the_first_output_survives_merging() -> None:
    """The engine reports it on the output carrying the first token only; a merge must keep it."""
    box = Outbox()
    box.post(TokenOutput("a", [1], cached_tokens=32))
    box.post(TokenOutput("a", [2]))
    assert box.take() == [TokenOutput("a", [1, 2], cached_tokens=32)]
    box.post(TokenOutput("a", [3]))
    assert box.take() == [TokenOutput("a", [3])]


def test_first_outputs_go_before_later_outputs_of_older_requests() -> None:
    box = Outbox()
    box.post(TokenOutput("old", [1]))
    assert box.take() == [TokenOutput("old", [1])]
    box.post(TokenOutput("old", [2]))
    box.post(TokenOutput("new", [9]))
    box.post(TokenOutput("old", [3]))
    assert box.take() == [TokenOutput("new", [9])]
    assert box.take() == [TokenOutput("old", [2, 3])]
    # While a batch is being sent, a request's first output can be taken ahead of the rest of it.
    box.post(TokenOutput("new", [10]))
    box.post(TokenOutput("newer", [5]))
    assert box.take_first() == [TokenOutput("newer", [5])]
    assert box.take_first() == []
    assert box.take() == [TokenOutput("new", [10])]


def test_a_finished_request_id_used_again_is_a_first_output_again() -> None:
    box = Outbox()
    box.post(TokenOutput("a", [1], "stop"))
    assert box.take() == [TokenOutput("a", [1], "stop")]
    box.post(TokenOutput("b", [2]))
    assert box.take() == [TokenOutput("b", [2])]
    box.post(TokenOutput("b", [3]))
    box.post(TokenOutput("a", [4]))
    assert box.take() == [TokenOutput("a", [4])]


def test_take_waits_for_a_post_and_ends_after_close() -> None:
    box = Outbox()
    got: list[list[TokenOutput] | None] = []
    taker = threading.Thread(target=lambda: got.extend([box.take(), box.take()]))
    taker.start()
    box.post(TokenOutput("a", [5]))
    box.close()
    taker.join(timeout=10)
    assert not taker.is_alive()
    # Either the post arrived before the first take or the close drained it: nothing is lost.
    assert got == [[TokenOutput("a", [5])], None]
