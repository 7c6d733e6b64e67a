"""Key lifecycle, shared by `floodgate keys` and the admin API: create, list, revoke, rotate, set-tier.

Every change that can turn a working key away (revoke, rotate's expiry, a tier change) or make one
work (create, import) is announced (`announce(key_sha256)`), so edges drop their cached lookup at
once where pub/sub is available."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass

from edge.keys.legacy import Imported, LegacyKey, import_keys, import_keys_file_into
from edge.keys.page import KeyPage
from edge.keys.record import KeyRecord, UnknownTier, checked_label, checked_user, new_record
from edge.keys.store import KeyIdTaken, KeyStore
from limiter.tiers import MAX_PERIOD_S

# False: the edges were not told (the cache TTL bounds the change; the announcer said so).
Announce = Callable[[str], Awaitable[bool]]
# A fresh key's id is taken about once in 2**48 / (keys stored) tries: a few tries more mean a
# store that refuses every insert, which is said rather than tried for ever.
NEW_KEY_TRIES = 4


class KeyNotFound(LookupError):
    def __init__(self, key_id: str, message: str | None = None) -> None:
        super().__init__(message or f"no key {key_id}")
        self.key_id = key_id


class InvalidPeriod(ValueError):
    """A key's lifetime must end in the future and a rotation's grace cannot end in the past: a key
    created already expired, or an old key cut off before the rotation that replaced it, is a typo,
    never what was meant. Neither may exceed MAX_PERIOD_S (limiter/tiers.py, 100 years): longer is
    a typo too (days for seconds, an exponent too many), and a time that far out is past what the
    platform's time functions take: one key expiring in 1e17 s made `floodgate keys list` crash for
    every key, for good (a revoked key is still listed)."""

    def __init__(self, param: str, seconds: float, allowed: str) -> None:
        limit = f"at most {MAX_PERIOD_S:.0f} (100 years)"
        super().__init__(f"{param} must be {allowed}, {limit}, not {seconds:g}")
        self.param = param


def checked_period(param: str, seconds: float, *, zero_ok: bool = False) -> float:
    """`seconds`, if it is a lifetime (or, `zero_ok`, a grace) a key may be given: the one check
    every way of setting an expiry goes through. NaN fails both comparisons."""
    if (seconds >= 0 if zero_ok else seconds > 0) and seconds <= MAX_PERIOD_S:
        return seconds
    allowed = "0 or a positive number of seconds" if zero_ok else "a positive number of seconds"
    raise InvalidPeriod(param, seconds, allowed)


class KeyNotActive(KeyNotFound):
    """A revoked or expired key is refused for good: a change to it (a tier, a successor) is one
    nobody can use, and an answer that it was made misleads the operator."""

    def __init__(self, key_id: str, status: str, what: str) -> None:
        super().__init__(key_id, f"key {key_id} is {status}: only an active key {what}")


class KeyNotRotatable(KeyNotActive):
    """Only an active key has a successor: a revoked or expired one has nothing left to hand over."""

    def __init__(self, key_id: str, status: str) -> None:
        super().__init__(key_id, status, "can be rotated")


class KeyAlreadyRotated(KeyNotFound):
    """A key is replaced once. A second rotate (a retry whose answer was lost, a script run again,
    a second operator) made a second replacement that inherited the grace's end as its expiry and
    died with the old key, while the first replacement, whose key may never have been seen, lived
    on. Refused, naming the replacement: its key was shown once, to the first rotate; if it was
    lost, rotate the replacement in turn."""

    def __init__(self, key_id: str, replaced_by: str) -> None:
        super().__init__(
            key_id,
            f"key {key_id} was already rotated: its replacement is {replaced_by}"
            f" (if that key was lost, rotate {replaced_by} in turn)",
        )
        self.replaced_by = replaced_by


@dataclass(frozen=True, slots=True)
class Rotated:
    key: str  # the new key, in clear: shown once
    new: KeyRecord
    old: KeyRecord  # now expiring at the end of the grace period, replaced_by the new one


@dataclass(frozen=True, slots=True)
class Revoked:
    key: KeyRecord  # the key named, revoked
    replaced: tuple[KeyRecord, ...]  # the older keys of its rotations revoked with it, newest first


async def _no_announce(key_sha256: str) -> bool:
    return True


class KeyLifecycle:
    def __init__(
        self,
        store: KeyStore,
        tiers: Collection[str],
        *,
        rotation_grace_s: float,
        announce: Announce | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self._tiers = tiers
        self._grace_s = rotation_grace_s
        self._announce = announce or _no_announce
        self._clock = clock

    def _check_tier(self, tier: str) -> None:
        if tier not in self._tiers:
            raise UnknownTier(tier, self._tiers)

    async def _find(self, key_id: str) -> KeyRecord:
        record = await self.store.by_id(key_id)
        if record is None:
            raise KeyNotFound(key_id)
        return record

    async def _new_key(
        self, user: str, tier: str, label: str, expires: float | None, replaces: str | None = None
    ) -> tuple[str, KeyRecord]:
        """A fresh key, stored. Its id (48 bits of its hash) may be another key's: the store refuses
        it (KeyStore.add) and another key is made. Before, the refusal went unread and the key was
        handed out unstored (refused by every edge; a rotation's old key then expired into a
        replacement that was someone else's), or stored beside the other under one id."""
        for _ in range(NEW_KEY_TRIES):
            key, record = new_record(user, tier, label, expires)
            record = record.with_changes(replaces=replaces)
            try:
                added = await self.store.add(record)
            except (Exception, asyncio.CancelledError):
                # Interrupted or failed waiting for the insert, which may have landed all the same
                # (a store's worker thread runs on): a live key nobody would be shown, revoked.
                if await self.store.get(record.key_sha256) is not None:
                    await self._withdraw(record)
                raise
            if added:
                return key, record
        raise KeyIdTaken(
            f"the key store refused {NEW_KEY_TRIES} fresh keys in a row (their ids taken); "
            "nothing was written: try again"
        )

    async def create(
        self, user: str, tier: str, label: str = "", expires_in_s: float | None = None
    ) -> tuple[str, KeyRecord]:
        checked_user(user)
        checked_label(label)
        if expires_in_s is not None:
            checked_period("expires_in_s", expires_in_s)
        self._check_tier(tier)
        expires = None if expires_in_s is None else self._clock() + expires_in_s
        key, record = await self._new_key(user, tier, label, expires)
        try:
            # An edge may have cached this hash as unknown (someone tried it early): unlikely, but cheap.
            await self._announce(record.key_sha256)
        except (Exception, asyncio.CancelledError):
            # Interrupted (Ctrl-C in `floodgate keys create`, an admin API client gone) or failed
            # while the edges were told, which a slow Redis holds for its timeout: the key was left
            # stored and working, shown to nobody. The revocation runs: the task's one cancellation
            # was delivered by now.
            await self._withdraw(record)
            raise
        return key, record

    async def list_keys(self, user: str | None = None) -> list[KeyRecord]:
        return await self.store.list_keys(user)

    async def page_keys(self, user: str | None, after: str | None, limit: int) -> KeyPage:
        return await self.store.page_keys(user, after, limit)

    async def revoke(self, key_id: str) -> KeyRecord:
        """The key, revoked, with the keys it replaced (`revoke_line`)."""
        return (await self.revoke_line(key_id)).key

    async def revoke_line(self, key_id: str) -> Revoked:
        """The key, and every key it replaced that is still in a rotation's grace: one user's one
        credential changing hands. Before, revoking the new key left the old one working to the
        end of its grace, though the owner had cut that credential off. The keys it was replaced
        by are left: revoking an old key is how its grace is ended early. The older keys revoked
        are returned too, for the operator to be told: a key still in use (a deployment not yet
        moved to its replacement) stops working with it."""
        record = await self._find(key_id)
        if record.revoked is None:
            record = record.with_changes(revoked=self._clock())
            await self.store.put(record)
        await self._announce(record.key_sha256)
        # Also when it was revoked already: a revocation made before this fix ends its graces too.
        return Revoked(record, await self._revoke_replaced(record))

    async def _revoke_replaced(self, record: KeyRecord) -> tuple[KeyRecord, ...]:
        """Followed by `replaces` (a read by id each, no scan), and only where the older key names
        this one as its replacement: a rotation that lost its race made a key that names the old
        one but never replaced it. Revoked, not expired now: a revocation is the one change no
        write read before it can undo (KeyStore.put), where a tier change racing it would write
        the grace's end back. A rotation made before `replaces` was kept has no link to follow:
        its old key's grace ends as it was set to."""
        now = self._clock()
        seen = {record.id}
        newer = record
        revoked: list[KeyRecord] = []
        while newer.replaces is not None and newer.replaces not in seen:
            seen.add(newer.replaces)
            older = await self.store.by_id(newer.replaces)
            if older is None or older.replaced_by != newer.id:
                break
            if older.status(now) == "active":
                older = older.with_changes(revoked=now)
                await self.store.put(older)
                await self._announce(older.key_sha256)
                revoked.append(older)
            newer = older
        return tuple(revoked)

    async def import_keys(self, keys: list[LegacyKey]) -> Imported:
        """Insert-only (edge/keys/legacy.py). Every key added is announced: an edge that was asked
        with it before caches it as unknown, and refused it for the cache TTL after the import."""
        return await self._announced(await import_keys(self.store, keys))

    async def import_keys_file(self, keys_file: str) -> Imported:
        """`[server] keys_file`, as every start and every key command import it."""
        return await self._announced(await import_keys_file_into(self.store, keys_file, self._tiers))

    async def _announced(self, done: Imported) -> Imported:
        for digest in done.new:
            if not await self._announce(digest):
                break  # said once; the rest would each wait out the same unreachable Redis
        return done

    async def set_tier(self, key_id: str, tier: str) -> KeyRecord:
        """The key's tier, and that of every other key of its rotations that still works: a key and
        its replacement are one user's one credential, changing hands for the grace. Before, the
        tier moved on the key named only, and the other went on at the old tier (the replacement
        for good). Only an active key's (KeyNotActive): a revoked one's was answered as changed."""
        self._check_tier(tier)
        found = await self._find(key_id)
        if (status := found.status(self._clock())) != "active":
            raise KeyNotActive(key_id, status, "can be moved to another tier")
        record = found.with_changes(tier=tier)
        await self.store.put(record)
        await self._announce(record.key_sha256)
        # Read after the write: a rotation that landed meanwhile is linked by now (KeyStore.put
        # keeps its link), and one that lands later reads this tier (rotate).
        chain = await self._rotation_chain(record)
        now = self._clock()
        for other in chain:
            if other.id != record.id and other.tier != tier and other.status(now) == "active":
                await self.store.put(other.with_changes(tier=tier))
                await self._announce(other.key_sha256)
        return next((r for r in chain if r.id == record.id), record)

    async def _rotation_chain(self, record: KeyRecord) -> list[KeyRecord]:
        """The keys linked to this one by rotations (`replaced_by`, either way), itself included, as
        stored now. A rotation keeps the user: that user's keys are all there is to look at."""
        keys = {r.id: r for r in await self.store.list_keys(record.user)}
        linked: dict[str, set[str]] = {}
        for r in keys.values():
            if r.replaced_by is not None:
                linked.setdefault(r.id, set()).add(r.replaced_by)
                linked.setdefault(r.replaced_by, set()).add(r.id)
        found, todo = {record.id}, [record.id]
        while todo:
            for other in linked.get(todo.pop(), ()):
                if other not in found:
                    found.add(other)
                    todo.append(other)
        return [keys[i] for i in found if i in keys]

    async def rotate(self, key_id: str, grace_s: float | None = None) -> Rotated:
        """A new key for the same user, tier, label and expiry; the old one keeps working for the
        grace period (keys.rotation_grace_s unless given), then expires. Once: a key already
        replaced is refused (KeyAlreadyRotated), so the new key always inherits the old key's own
        expiry, never the grace's end."""
        grace = self._grace_s if grace_s is None else checked_period("grace_s", grace_s, zero_ok=True)
        old = await self._find(key_id)
        if (status := old.status(self._clock())) != "active":
            raise KeyNotRotatable(key_id, status)
        if old.replaced_by is not None:
            raise KeyAlreadyRotated(key_id, old.replaced_by)
        key, new = await self._new_key(old.user, old.tier, old.label, old.expires, replaces=old.id)
        try:
            return await self._replace(old, key, new, grace)
        except KeyNotFound:
            raise  # refused: its new key revoked already
        except (Exception, asyncio.CancelledError):
            # Interrupted (Ctrl-C in `floodgate keys rotate`, an admin API client gone) or failed
            # with the new key stored and shown to nobody: it was left live, an orphan credential.
            # Once the retire has landed the rotation stands (no store takes a replacement back) and
            # its key is handed back, to be shown; before, the key is revoked and the old one is as
            # it was. The read runs: the task's one cancellation was delivered by now.
            stored = await self.store.get(old.key_sha256)
            if stored is not None and stored.replaced_by == new.id:
                return Rotated(key, new, stored)
            await self._withdraw(new)
            raise

    async def _withdraw(self, new: KeyRecord) -> None:
        """A fresh key that nobody will be shown (its rotation or creation did not finish), revoked."""
        await self.store.put(new.with_changes(revoked=self._clock()))
        await self._announce(new.key_sha256)

    async def _replace(self, old: KeyRecord, key: str, new: KeyRecord, grace: float) -> Rotated:
        """The old key retired in favour of the stored new one, which is revoked if it lost a race."""
        ends = self._clock() + grace
        expires = ends if old.expires is None else min(old.expires, ends)
        # Two rotations that read the key at once both get here; the store keeps the first
        # replacement (KeyStore.retire). The other's key was never shown: it is revoked, not left live.
        stored = await self.store.retire(old.key_sha256, new.id, expires)
        if stored is None or stored.replaced_by != new.id:
            await self._withdraw(new)
            if stored is None:
                raise KeyNotFound(old.id)  # gone since it was read: no store deletes a key
            if stored.replaced_by is not None:
                raise KeyAlreadyRotated(old.id, stored.replaced_by)
            # Revoked since it was read: retire refused it (a revocation may drop the link too).
            raise KeyNotRotatable(old.id, stored.status(self._clock()))
        while stored.tier != new.tier:
            # A tier change landed between this rotation's read and its write, and found no
            # replacement to move with it: the new key takes it now. Then the old key is read
            # again: a later change that read the new key before this write found it at its own
            # tier and left it, and is on the old key; one that reads it after this write moves it.
            new = new.with_changes(tier=stored.tier)
            await self.store.put(new)
            await self._announce(new.key_sha256)
            stored = await self.store.get(old.key_sha256) or stored
        await self._announce(old.key_sha256)
        return Rotated(key, new, stored)
