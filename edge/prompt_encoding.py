"""Chat messages to prompt token ids, without stalling the event loop every stream shares.

Rendering the chat template and tokenizing cost time in proportion to the body: to the characters,
and also to the number of messages (the template loops over them; on the demo model 2048 empty
messages take ~35 ms, as long as ~160,000 characters of content in one message). A prompt whose
estimated cost is small runs inline (a thread hop costs more than the work); a larger one runs in a
worker thread. schemas.MAX_MESSAGES bounds the message count before any of this starts.
"""

from __future__ import annotations

from collections.abc import Callable

import anyio

Messages = list[dict[str, str]]

# Work above this many "characters" runs in a worker thread (~4 ms of template + tokenizer work).
INLINE_COST_LIMIT = 16_384
# What one message costs the template on top of its content, in characters of content: measured
# on the demo model, one empty message costs about as much as 70 characters of content.
MESSAGE_COST_CHARS = 64


def encoding_cost(messages: Messages) -> int:
    """The work of encoding these messages, in characters of content."""
    return sum(len(m["content"]) + MESSAGE_COST_CHARS for m in messages)


def runs_inline(messages: Messages) -> bool:
    return encoding_cost(messages) <= INLINE_COST_LIMIT


async def encode_messages(
    encode_chat: Callable[[Messages, str], list[int]], messages: Messages, scope: str
) -> list[int]:
    """`encode_chat(messages, scope)`, on the loop when cheap, else in a worker thread."""
    if runs_inline(messages):
        return encode_chat(messages, scope)
    return await anyio.to_thread.run_sync(encode_chat, messages, scope)
