"""What the edge asks of a key store."""

from __future__ import annotations

from typing import Protocol

from edge.keys.page import KeyPage
from edge.keys.record import KeyRecord


class KeyIdTaken(RuntimeError):
    """The store refused every id tried for a key (KeyStore.add): other keys hold them. Nothing was
    written, so the caller may try again. Before, a bare RuntimeError: the admin API answered it
    500, the CLI with a traceback."""


class KeyStore(Protocol):
    async def get(self, key_sha256: str) -> KeyRecord | None:
        """The record of the key with this hash (revoked and expired ones too), or None."""
        ...

    async def add(self, record: KeyRecord) -> bool:
        """Insert the record unless its hash is already stored, or another key has its id; False
        then (the stored one is kept: an import never brings a revoked key back). Ids are 48 bits
        of the hash and can agree: two keys under one id made revoke, rotate and set-tier act on
        either, and a key whose insert failed on the id was handed out all the same."""
        ...

    async def put(self, record: KeyRecord) -> None:
        """Overwrite the record (tier change, revocation, expiry), found by its hash; but never
        undo a stored revocation. A tier change or a rotation writes back the record it read: a
        revocation that landed in between was undone, and the key the operator was told is
        revoked went on working (for good after a tier change, for the grace after a rotation).

        Nor undo a stored replacement (`replaced_by`, set by a rotation): a write from a record read
        before the rotation keeps the stored replacement and the expiry the rotation set (else a
        tier change made the retiring key work for good, or a second rotation racing the first
        made a second replacement). A revocation's write may drop the link: the key is dead
        either way."""
        ...

    async def retire(self, key_sha256: str, replaced_by: str, expires: float) -> KeyRecord | None:
        """A rotation's write: set the key's replacement and the end of its grace, and nothing
        else, unless it has a replacement already (the first rotation's stands) or is revoked. The
        stored record after (None: no such key). Only these two fields: a whole record written
        back, as read before a tier change that landed meanwhile, undid the tier change. Not over a
        revocation: one that landed after the rotation read the key was marked replaced, and the
        rotation handed out a new key that worked, for a credential the operator had cut off."""
        ...

    async def by_id(self, key_id: str) -> KeyRecord | None: ...

    async def list_keys(self, user: str | None = None) -> list[KeyRecord]:
        """Every key (of `user`), oldest first, read consistently: what a rotation's chain is
        found in. For operators, page_keys: this reads them all at once."""
        ...

    async def page_keys(self, user: str | None, after: str | None, limit: int) -> KeyPage:
        """Up to `limit` keys (of `user`) whose ids follow `after`, in id order: one bounded read
        however many keys are stored. Eventually consistent on DynamoDB (its index): a key made a
        moment ago may show on the next listing only."""
        ...

    async def any_usable(self, now: float) -> bool:
        """Whether at least one stored key works at `now` (neither revoked nor expired): what
        `serve`'s development key is made for when there is none. Any stored key counted before,
        so a user who revoked the printed key, or whose keys had all expired, got no new one, and
        every request of theirs a 401."""
        ...

    async def aclose(self) -> None: ...
