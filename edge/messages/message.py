"""One stored chat message, as the stores keep it and the history route returns it."""

from __future__ import annotations

import time
from dataclasses import dataclass

from edge.messages.ids import new_message_id


@dataclass(frozen=True, slots=True)
class StoredMessage:
    conversation_id: str
    user: str
    message_id: str  # time-ordered (see ids.py): history sorts on it
    role: str
    content: str
    request_id: str
    created_at: float  # Unix seconds
    finish_reason: str | None = None
    # Kept cut short: the store could not hold it whole (edge/messages/dynamodb.py).
    truncated: bool = False
    # The participant who said it (OpenAI's message `name`): a multi-participant chat's history
    # replays each turn as its speaker's.
    name: str | None = None
    # The served model that wrote it (an assistant's turn): a conversation may move from model to
    # model, and its history read back could not tell which said what. None for a user's turn, and
    # for a reply stored before turns kept it.
    model: str | None = None


def new_message(
    conversation_id: str,
    user: str,
    role: str,
    content: str,
    request_id: str,
    finish_reason: str | None = None,
    *,
    name: str | None = None,
    model: str | None = None,
    message_id: str | None = None,
) -> StoredMessage:
    """A message stamped now, with `message_id` or a fresh time-ordered id."""
    return StoredMessage(
        conversation_id=conversation_id,
        user=user,
        message_id=new_message_id() if message_id is None else message_id,
        role=role,
        content=content,
        request_id=request_id,
        created_at=time.time(),
        finish_reason=finish_reason,
        name=name,
        model=model,
    )
