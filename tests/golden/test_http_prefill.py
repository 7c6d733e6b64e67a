"""vLLM's assistant prefill through the real edge, with the official openai SDK's extra_body, on the
real model: `continue_final_message` (with `add_generation_prompt` false) continues the final
assistant message instead of opening a new turn, so a reply begun with the first k tokens of the
reference's greedy reply (tests/golden/reference.py) goes on with the rest of it, token for token.
`add_generation_prompt` false alone renders the conversation without the assistant's opening."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openai
import pytest
from openai import OpenAI

from edge.text.model_text import ModelText
from gpu_container.checkpoint.bundled import MODEL_NAME
from gpu_container.checkpoint.facts import read_facts
from tests.golden.reference import CONVERSATIONS, MAX_NEW_TOKENS
from tests.support.live_server import LiveServer

END = 2  # <|im_end|>
CONTINUE = {"continue_final_message": True, "add_generation_prompt": False}


def _client(edge: LiveServer) -> OpenAI:
    return OpenAI(base_url=edge.base_url + "/v1", api_key=edge.keys["paid"], max_retries=0, timeout=120)


# (conversation, reply tokens the client sends as the assistant's beginning): "The capital of France
# is", and the haiku's first line with its newline (whitespace at the end, kept as the template keeps it).
@pytest.mark.parametrize(("which", "begun"), [(0, 5), (1, 11)])
def test_a_begun_reply_is_continued_as_the_model_would_have_gone_on(
    local_edge: LiveServer, which: int, begun: int
) -> None:
    tokenizer = read_facts(local_edge.settings.model.path).text.tokenizer
    conversation = CONVERSATIONS[which]
    greedy = conversation.greedy_ids
    prefix = tokenizer.decode(greedy[:begun])
    assert tokenizer.encode(prefix, add_special_tokens=False).ids == greedy[:begun]  # spelled alike
    messages: Any = [*conversation.messages, {"role": "assistant", "content": prefix}]
    with _client(local_edge) as client:
        done = client.chat.completions.create(
            model=MODEL_NAME,
            messages=messages,
            temperature=0,
            max_tokens=MAX_NEW_TOKENS - begun,
            extra_body=CONTINUE,
        )
    # The reference's prompt, then the begun reply's tokens: no turn closed, none opened.
    assert done.usage is not None
    assert done.usage.prompt_tokens == len(conversation.prompt_ids) + begun
    rest = greedy[begun:]
    assert done.choices[0].message.content == tokenizer.decode([t for t in rest if t != END])
    assert done.choices[0].finish_reason == ("stop" if rest[-1] == END else "length")


# transformers' apply_chat_template(continue_final_message=True) on the same GGUF (the reference's
# versions, tests/golden/reference.py), encoded without added special tokens: a begun reply with
# whitespace on both sides, both kept as the template writes them (its trailing "\n" is the 198).
PREFILLED: Any = [
    {"role": "user", "content": "Name three fruits, one a line."},
    {"role": "assistant", "content": " Here they are:\n"},
]
PREFILLED_IDS = [
    *[1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018, 411, 407],
    *[19712, 8182, 2, 198, 1, 4093, 198, 5820, 1296, 5574, 28, 582, 253, 1761, 30, 2, 198, 1, 520],
    *[9531, 198, 3726, 502, 359, 42, 198],
]


def test_a_begun_reply_with_whitespace_on_both_sides_is_the_references_prompt(
    local_edge: LiveServer, smollm2: Path
) -> None:
    text = ModelText.load(smollm2)
    assert text.encode_chat(PREFILLED, end="continue") == PREFILLED_IDS
    with _client(local_edge) as client:
        done = client.chat.completions.create(
            model=MODEL_NAME, messages=PREFILLED, max_tokens=1, extra_body=CONTINUE
        )
    assert done.usage is not None and done.usage.prompt_tokens == len(PREFILLED_IDS)


def test_without_the_generation_prompt_the_conversation_ends_as_it_stands(local_edge: LiveServer) -> None:
    tokenizer = read_facts(local_edge.settings.model.path).text.tokenizer
    conversation = CONVERSATIONS[0]
    with _client(local_edge) as client:
        done = client.chat.completions.create(
            model=MODEL_NAME,
            messages=conversation.messages,  # type: ignore[arg-type]
            max_tokens=1,
            extra_body={"add_generation_prompt": False},
        )
    assert done.usage is not None
    opened = conversation.prompt_ids[done.usage.prompt_tokens :]
    assert tokenizer.decode(opened, skip_special_tokens=False) == "<|im_start|>assistant\n"


def test_continuing_and_opening_a_new_turn_at_once_is_refused(local_edge: LiveServer) -> None:
    """vLLM's 400, as transformers refuses it: both would continue a turn and open another."""
    messages: Any = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
    with _client(local_edge) as client:
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(
                model=MODEL_NAME, messages=messages, extra_body={"continue_final_message": True}
            )
        assert info.value.param == "continue_final_message"
        # Nothing to continue: an empty final message is refused, not cut somewhere else.
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(
                model=MODEL_NAME,
                messages=[*messages[:1], {"role": "assistant", "content": " "}],
                extra_body=CONTINUE,
            )
        assert info.value.param == "messages"
