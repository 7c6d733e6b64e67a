"""What the edge asks of a message store."""

from __future__ import annotations

from typing import Protocol

from edge.messages.message import StoredMessage

# How long a message is kept when the settings do not say ([messages] ttl_days).
DEFAULT_TTL_S = 90 * 86400


class MessageRefused(Exception):
    """The store refuses this message itself: writing it again would fail the same way."""


class MessageStore(Protocol):
    async def append(self, msg: StoredMessage) -> None:
        """Write one message. Idempotent: writing the same message id twice keeps one copy.
        Raises MessageRefused when no retry could write it."""
        ...

    async def history(self, conversation_id: str, user: str, limit: int = 100) -> list[StoredMessage]:
        """The latest `limit` messages of the conversation, oldest first. A conversation is seen only
        by the user who wrote it: another user gets [] (the route answers 404 then)."""
        ...

    async def aclose(self) -> None: ...
