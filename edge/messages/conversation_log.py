"""A named conversation's turns, handed to the message writer off the hot path.

A stream's user message is submitted with its first text, so an edge that dies mid-stream still
keeps what the user asked; the reply (partial too) follows at the end. A request not streamed
submits both with its answer, and neither when it is answered with an error alone or its client
hung up before the answer (edge/generation.py, `Generation._record`).

Each turn's id is made greater than `after`, the conversation's newest id as the request's lock
knows it (edge/messages/conversation_lock.py), and returned, for the next turn's `after`: history
is read in id order, and consecutive turns are made on whichever edges serve them, by clocks a few
milliseconds apart.
"""

from __future__ import annotations

from edge.messages.ids import MessageIdGenerator
from edge.messages.message import new_message
from edge.messages.writer import MessageWriter


class ConversationLog:
    def __init__(self, writer: MessageWriter, ids: MessageIdGenerator | None = None) -> None:
        self._writer = writer
        self._ids = ids or MessageIdGenerator()

    def record_prompt(
        self,
        conversation_id: str,
        user: str,
        request_id: str,
        prompt: str,
        name: str | None = None,
        *,
        after: str | None = None,
    ) -> str:
        message_id = self._ids.new_id(after=after)
        self._writer.submit(
            new_message(conversation_id, user, "user", prompt, request_id, name=name, message_id=message_id)
        )
        return message_id

    def record_reply(
        self,
        conversation_id: str,
        user: str,
        request_id: str,
        reply: str,
        finish_reason: str,
        model: str,
        *,
        after: str | None = None,
    ) -> str:
        message_id = self._ids.new_id(after=after)
        self._writer.submit(
            new_message(
                conversation_id,
                user,
                "assistant",
                reply,
                request_id,
                finish_reason,
                model=model,
                message_id=message_id,
            )
        )
        return message_id
