"""edge/prompt_encoding.py: a prompt's template and tokenizer work runs on the event loop only while
it is small; a long new message is encoded on a worker thread (where the tokenizer lets go of the
GIL, so every other stream's tokens go on), and its ids are the tokenizer's own either way."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from edge.prompt_encoding import encode_messages
from edge.text.chat_template import PromptEnd
from edge.text.model_text import ModelText
from tests.support.live_server import demo_model_dir

pytestmark = pytest.mark.anyio

PROSE = "Continuous batching joins new sequences at every engine step, 42 of them. "


Encode = Callable[[list[dict[str, str]], str, PromptEnd], list[int]]


def _recording(text: ModelText) -> tuple[list[str], Encode]:
    threads: list[str] = []
    encode = text.encode_chat

    def recording(messages: list[dict[str, str]], scope: str = "", end: PromptEnd = "reply") -> list[int]:
        threads.append(threading.current_thread().name)
        return encode(messages, scope, end)

    return threads, recording


@pytest.mark.parametrize(("chars", "on_loop"), [(600, True), (6_000, False), (60_000, False)])
async def test_only_a_short_prompt_is_encoded_on_the_loop(chars: int, on_loop: bool) -> None:
    text = ModelText.load(demo_model_dir())
    threads, recording = _recording(text)
    messages = [{"role": "user", "content": (PROSE * (chars // len(PROSE) + 1))[:chars]}]

    ids = await encode_messages(recording, messages, "alice")

    expected = text.tokenizer.encode(text.template.render(messages), add_special_tokens=False).ids
    assert ids == expected
    assert (threads == [threading.current_thread().name]) is on_loop, threads
