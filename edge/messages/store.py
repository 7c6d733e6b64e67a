"""What the edge asks of a message store, and how a page of a history is cut (both stores alike)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal, Protocol

from edge.messages.message import StoredMessage

# How long a message is kept when the settings do not say ([messages] ttl_days).
DEFAULT_TTL_S = 90 * 86400

Order = Literal["asc", "desc"]

# The most text (characters of content) one page of a history holds, whatever its `limit`: a page
# ends early past it (`has_more`), after its first message however long. A message may be as long
# as a request body (1 MiB), and a page of 1,000 such was a gigabyte read and built whole in the
# edge's memory, for any user to ask for again and again.
PAGE_CHARS = 4_000_000


class MessageRefused(Exception):
    """The store refuses this message itself: writing it again would fail the same way."""


@dataclass(frozen=True, slots=True)
class HistoryPage:
    messages: list[StoredMessage]  # in the order asked
    # More messages lie past this page, in the direction it was read: after its last message, or,
    # for a page read with `before`, before its first.
    has_more: bool


@dataclass(frozen=True, slots=True)
class Span:
    """A page's query in terms of the message ids (time-ordered: edge/messages/ids.py): the ids
    strictly between `above` and `below` (None: unbounded), read in ascending id order or not, the
    first limit + 1 kept (one more than the page, to tell `has_more`; fewer past the page's text:
    `reads`); `reverse` turns what was read into the order asked."""

    above: str | None
    below: str | None
    ascending: bool
    reverse: bool

    @property
    def empty(self) -> bool:
        return self.above is not None and self.below is not None and self.above >= self.below

    def page(self, found: list[StoredMessage], limit: int) -> HistoryPage:
        """The page out of the messages read (each store reads them its own way, `reads` says how
        many): its first `limit`, fewer where their text passes PAGE_CHARS."""
        page: list[StoredMessage] = []
        chars = 0
        for msg in found[:limit]:
            chars += len(msg.content)
            if page and chars > PAGE_CHARS:
                break
            page.append(msg)
        has_more = len(found) > len(page)
        if self.reverse:
            page.reverse()
        return HistoryPage(page, has_more=has_more)


def reads(messages: Iterable[StoredMessage], limit: int) -> list[StoredMessage]:
    """What a store reads for a page of `limit` (Span.page), taken from `messages` in the order
    read: `limit` + 1, one more than the page to tell `has_more`; fewer where their text passes
    PAGE_CHARS, up to the one that passes it (the page ends before it, unless it is the
    first: the one after it then)."""
    read: list[StoredMessage] = []
    chars = 0
    for msg in messages:
        read.append(msg)
        chars += len(msg.content)
        if _past_page(len(read), chars, limit):
            break
    return read


def full(read: list[StoredMessage], limit: int) -> bool:
    """Whether what a store read holds all a page of `limit` reads (`reads`)."""
    return _past_page(len(read), sum(len(m.content) for m in read), limit)


def _past_page(count: int, chars: int, limit: int) -> bool:
    """Whether `count` messages of `chars` characters read reach one past the page: the page's
    first message is kept however long, so one past its text is at least the second (a first past
    PAGE_CHARS alone ended the read there, and its page said has_more false, whatever followed)."""
    return count > limit or (count > 1 and chars > PAGE_CHARS)


def span(after: str | None, before: str | None, order: Order) -> Span:
    """`after` and `before` are cursors in the list's own order, as OpenAI's list endpoints take
    them: with order "desc", after a message means older than it. A page with `before` is the one
    right before that cursor (the previous page), so it is read from the cursor back."""
    if order == "asc":
        above, below = after, before
    else:
        above, below = before, after
    backward = before is not None
    return Span(above, below, ascending=(order == "asc") != backward, reverse=backward)


class MessageStore(Protocol):
    async def append(self, msg: StoredMessage) -> None:
        """Write one message. Idempotent: writing the same message id twice keeps one copy.
        Raises MessageRefused when no retry could write it."""
        ...

    async def history(
        self,
        conversation_id: str,
        user: str,
        limit: int = 100,
        *,
        after: str | None = None,
        before: str | None = None,
        order: Order = "asc",
    ) -> HistoryPage:
        """One page of the conversation, `limit` messages at most, in message id order (`order`;
        ascending: oldest first): the first ones after the cursor `after` (or from the start), or,
        with `before`, the last ones before it; with both, between them. A conversation is seen only
        by the user who wrote it: another user gets an empty page (the route answers 404 then)."""
        ...

    async def aclose(self) -> None: ...
