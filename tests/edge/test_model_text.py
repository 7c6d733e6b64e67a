"""ModelText.encode_chat: the prompt ids are exactly the tokenizer's own encoding of the rendered
chat template, whatever the messages hold (it encodes without offsets, for speed)."""

from __future__ import annotations

import pytest

from edge.text.model_text import ModelText
from tests.support.live_server import demo_model_dir
from tests.support.smollm2 import smollm2_dir

CHATS = [
    [{"role": "user", "content": "Hello!"}],
    [
        {"role": "system", "content": "You answer in one line."},
        {"role": "user", "content": "Emoji 😀👍🏽, flags 🇫🇷, 中文, 한국어, café — “quotes”"},
        {"role": "assistant", "content": "  spaces\tand\nnewlines  "},
        {"role": "user", "content": "<|im_start|> is text here, not a token" * 20},
    ],
    [{"role": "user", "content": ""}],
]


@pytest.mark.parametrize("which", ["demo", "real"])
@pytest.mark.parametrize("chat", range(len(CHATS)))
def test_prompt_ids_are_the_tokenizers_encoding_of_the_rendered_template(which: str, chat: int) -> None:
    text = ModelText.load(demo_model_dir() if which == "demo" else smollm2_dir())
    messages = CHATS[chat]
    rendered = text.template.render(messages)
    expected = text.tokenizer.encode(rendered, add_special_tokens=False).ids
    assert text.encode_chat(messages) == expected
    assert expected, "the template writes at least its own markers"
