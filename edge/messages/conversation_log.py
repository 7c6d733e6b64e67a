"""A named conversation's turns, handed to the message writer off the hot path.

A stream's user message is submitted with its first text, so an edge that dies mid-stream still
keeps what the user asked; the reply (partial too) follows at the end. A request not streamed
submits both with its answer, and neither when it is answered with an error alone or its client
hung up before the answer (edge/generation.py, `Generation._record`).
"""

from __future__ import annotations

from edge.messages.message import new_message
from edge.messages.writer import MessageWriter


class ConversationLog:
    def __init__(self, writer: MessageWriter) -> None:
        self._writer = writer

    def record_prompt(
        self, conversation_id: str, user: str, request_id: str, prompt: str, name: str | None = None
    ) -> None:
        self._writer.submit(new_message(conversation_id, user, "user", prompt, request_id, name=name))

    def record_reply(
        self, conversation_id: str, user: str, request_id: str, reply: str, finish_reason: str, model: str
    ) -> None:
        self._writer.submit(
            new_message(conversation_id, user, "assistant", reply, request_id, finish_reason, model=model)
        )
