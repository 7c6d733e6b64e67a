"""A finished turn of a named conversation, handed to the message writer off the hot path."""

from __future__ import annotations

from edge.messages.message import new_message
from edge.messages.writer import MessageWriter


class ConversationLog:
    def __init__(self, writer: MessageWriter) -> None:
        self._writer = writer

    def record_turn(
        self, conversation_id: str, user: str, request_id: str, prompt: str, reply: str, finish_reason: str
    ) -> None:
        self._writer.submit(new_message(conversation_id, user, "user", prompt, request_id))
        self._writer.submit(new_message(conversation_id, user, "assistant", reply, request_id, finish_reason))
