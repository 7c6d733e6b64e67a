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
    taken = box.take()
    assert taken == [TokenOutput("a", [1, 2, 3], "length"), TokenOutput("b", [7])]
    box.post(TokenOutput("b", [8], "stop"))
    assert box.take() == [TokenOutput("b", [8], "stop")]


def test_an_error_survives_merging() -> None:
    box = Outbox()
    box.post(TokenOutput("a", [1]))
    box.post(TokenOutput("a", [], "error", "boom"))
    assert box.take() == [TokenOutput("a", [1], "error", "boom")]


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
    assert [b for b in got if b] == [[TokenOutput("a", [5])]]
    assert got[-1] is None
