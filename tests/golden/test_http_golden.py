"""End to end over HTTP through the real edge, with the official openai SDK, on the in-process and
the local Triton path: temperature 0 streams the reference implementation's greedy reply."""

from __future__ import annotations

from openai import OpenAI

from gpu_container.checkpoint.bundled import MODEL_NAME
from gpu_container.checkpoint.facts import read_facts
from tests.golden.reference import CONVERSATIONS, MAX_NEW_TOKENS
from tests.support.live_server import LiveServer

END = 2  # <|im_end|>


def test_greedy_replies_equal_the_reference(edge: LiveServer) -> None:
    tokenizer = read_facts(edge.settings.model.path).text.tokenizer
    client = OpenAI(base_url=edge.base_url + "/v1", api_key=edge.keys["paid"], max_retries=0, timeout=120)
    for conversation in CONVERSATIONS:
        stream = client.chat.completions.create(
            model=MODEL_NAME,
            messages=conversation.messages,  # type: ignore[arg-type]
            temperature=0,
            max_tokens=MAX_NEW_TOKENS,
            stream=True,
            stream_options={"include_usage": True},
        )
        text, finish, usage = "", None, None
        for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage
            for choice in chunk.choices:
                text += choice.delta.content or ""
                finish = choice.finish_reason or finish
        expected = conversation.greedy_ids
        ended = expected[-1] == END
        assert text == tokenizer.decode([t for t in expected if t != END])
        assert finish == ("stop" if ended else "length")
        assert usage is not None and usage.prompt_tokens == len(conversation.prompt_ids)
