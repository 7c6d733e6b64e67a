"""The outbox between the engine thread and the response sender."""

from __future__ import annotations

import threading

from gpu_container.engine.types import TokenOutput
from gpu_container.triton.cpu.outbox import Outbox


def _drain(box: Outbox) -> list[TokenOutput]:
    box.close()
    taken: list[TokenOutput] = []
    while (out := box.take()) is not None:
        taken.append(out)
    return taken


def test_outputs_of_one_request_merge_until_taken() -> None:
    box = Outbox()
    box.post(TokenOutput("a", [1]))
    box.post(TokenOutput("b", [7]))
    box.post(TokenOutput("a", [2, 3]))
    box.post(TokenOutput("a", [], "length"))
    assert box.take() == TokenOutput("a", [1, 2, 3], "length")
    box.post(TokenOutput("b", [8], "stop"))
    assert _drain(box) == [TokenOutput("b", [7, 8], "stop")]


def test_an_error_survives_merging() -> None:
    box = Outbox()
    box.post(TokenOutput("a", [1]))
    box.post(TokenOutput("a", [], "error", "boom"))
    assert _drain(box) == [TokenOutput("a", [1], "error", "boom")]


def test_a_first_output_goes_before_later_outputs_of_older_requests() -> None:
    box = Outbox()
    box.post(TokenOutput("old", [1]))
    assert box.take() == TokenOutput("old", [1])
    box.post(TokenOutput("old", [2]))
    box.post(TokenOutput("new", [9]))
    box.post(TokenOutput("old", [3]))
    # Once it has had its response, a request waits its turn behind the others again.
    assert box.take() == TokenOutput("new", [9])
    box.post(TokenOutput("new", [10], "length"))
    box.post(TokenOutput("newer", [5]))
    assert _drain(box) == [
        TokenOutput("newer", [5]),
        TokenOutput("old", [2, 3]),
        TokenOutput("new", [10], "length"),
    ]


def test_a_finished_request_id_used_again_is_a_first_output_again() -> None:
    box = Outbox()
    box.post(TokenOutput("a", [1], "stop"))
    assert box.take() == TokenOutput("a", [1], "stop")
    box.post(TokenOutput("b", [2]))
    assert box.take() == TokenOutput("b", [2])
    box.post(TokenOutput("b", [3]))
    box.post(TokenOutput("a", [4]))
    assert _drain(box) == [TokenOutput("a", [4]), TokenOutput("b", [3])]


def test_take_waits_for_a_post_and_ends_after_close() -> None:
    box = Outbox()
    got: list[TokenOutput | None] = []
    taker = threading.Thread(target=lambda: got.extend([box.take(), box.take()]))
    taker.start()
    box.post(TokenOutput("a", [5]))
    box.close()
    taker.join(timeout=10)
    assert not taker.is_alive()
    # Either the post arrived before the first take or the close drained it: nothing is lost.
    assert got == [TokenOutput("a", [5]), None]
