"""Chat messages to prompt token ids, without stalling the event loop every stream shares.

Rendering the chat template and tokenizing cost time in proportion to the body: to the characters,
and also to the number of messages (the template loops over them; on the demo model 2048 empty
messages take ~35 ms, as long as ~160,000 characters of content in one message). A prompt whose
estimated cost is small runs inline (a thread hop costs more than the work); a larger one runs in a
worker thread, of the prompts' own, by tier (edge/encode_queue.py), waiting for one at most the
tier's max_queue_wait_s. schemas.MAX_MESSAGES bounds the message count before any of this starts.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from edge.disconnect_watch import DisconnectWatch
from edge.encode_queue import encode_queue
from edge.hang_up import abandoned_on_hang_up
from edge.text.chat_template import PromptEnd

Messages = list[dict[str, str]]

# Work above this many "characters" runs in a worker thread, where the tokenizer lets go of the GIL
# and the loop goes on: about 3-6 ms of template and tokenizer work on a slow 2-core EPYC. It was
# 16,384 for "~4 ms", but SmolLM2's tokenizer takes 22 ms for 16,384 characters of prose there (7 µs
# a word; the demo model's 13 ms), and every stream's next token waited as long. The hop costs
# no CPU that bench.prompt_encoding can tell from its noise at these sizes.
INLINE_COST_LIMIT = 4_096
# What one message costs the template on top of its content, in characters of content: measured
# on the demo model, one empty message costs about as much as 70 characters of content.
MESSAGE_COST_CHARS = 64


def encoding_cost(messages: Messages) -> int:
    """The work of encoding these messages, in characters of content."""
    return sum(len(m["content"]) + MESSAGE_COST_CHARS for m in messages)


def runs_inline(messages: Messages) -> bool:
    return encoding_cost(messages) <= INLINE_COST_LIMIT


async def encode_messages(
    encode_chat: Callable[[Messages, str, PromptEnd], list[int]],
    messages: Messages,
    scope: str,
    end: PromptEnd = "reply",
    priority: int = 0,
    max_wait_s: float = math.inf,
    watch: DisconnectWatch | None = None,
    user: str = "",
) -> tuple[list[int], float]:
    """`encode_chat(messages, scope, end)`, on the loop when cheap, else in a worker thread, which a
    prompt of a higher `priority` (its tier's) gets first; and the seconds it waited for the thread,
    which its tier's max wait counts (edge/pipeline.py). Raises Overloaded ("wait_too_long") where
    no thread was free for it within `max_wait_s`, and the 499 `client_closed_request` where the
    client's connection (`watch`) went meanwhile (edge/hang_up.py): watched only here, where a
    prompt may wait, so a prompt encoded inline pays for no watch. `user`: whose prompt it is, for
    its turn among its tier's users (edge/encode_queue.py)."""
    if runs_inline(messages):
        return encode_chat(messages, scope, end), 0.0
    with abandoned_on_hang_up(watch):
        return await encode_queue().run(priority, max_wait_s, encode_chat, messages, scope, end, user=user)
