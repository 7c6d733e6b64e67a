"""The embedded key store: one SQLite file (WAL), shared by the edges of one host and the CLI."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path
from typing import Any

import anyio.to_thread

from edge.keys.page import KeyPage, page_of
from edge.keys.record import KeyRecord
from edge.sqlite_file import add_columns, create_private

_SCHEMA = """
CREATE TABLE IF NOT EXISTS api_keys (
    key_sha256 TEXT PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    user TEXT NOT NULL,
    tier TEXT NOT NULL,
    label TEXT NOT NULL,
    created REAL NOT NULL,
    expires REAL,
    revoked REAL,
    last4 TEXT NOT NULL,
    replaced_by TEXT,
    replaces TEXT
) WITHOUT ROWID
"""
# A user's keys in id order: page_keys of one user reads its page off this index, however many keys
# everyone else has (all users' pages read the UNIQUE index on id).
_USER_INDEX = "CREATE INDEX IF NOT EXISTS api_keys_user_id ON api_keys (user, id)"
_COLUMNS = "id, key_sha256, user, tier, label, created, expires, revoked, last4, replaced_by, replaces"
_PLACES = ",".join("?" * len(_COLUMNS.split(", ")))


# How long a statement waits for the file's write lock another connection holds (an edge's, the
# CLI's, a `sqlite3` shell's) before it fails "database is locked".
BUSY_WAIT_S = 10.0


def connect(path: str | Path) -> sqlite3.Connection:
    """A connection for worker threads (the caller serialises use with a lock), in WAL mode so the
    edges reading and the CLI writing one file do not wait on each other."""
    create_private(path)
    conn = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None, timeout=BUSY_WAIT_S)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    return conn


def _row(record: KeyRecord) -> tuple[Any, ...]:
    r = record
    return (
        r.id,
        r.key_sha256,
        r.user,
        r.tier,
        r.label,
        r.created,
        r.expires,
        r.revoked,
        r.last4,
        r.replaced_by,
        r.replaces,
    )


class SQLiteKeyStore:
    def __init__(self, path: str | Path) -> None:
        self._conn = connect(path)
        self._lock = threading.Lock()
        self._conn.execute(_SCHEMA)
        # `replaced_by` came with the refusal of a second rotation, `replaces` with a replacement's
        # revocation ending the old key's grace.
        add_columns(self._conn, "api_keys", ("replaced_by", "replaces"))
        self._conn.execute(_USER_INDEX)

    async def get(self, key_sha256: str) -> KeyRecord | None:
        return await anyio.to_thread.run_sync(self._one, "key_sha256", key_sha256)

    async def by_id(self, key_id: str) -> KeyRecord | None:
        return await anyio.to_thread.run_sync(self._one, "id", key_id)

    async def add(self, record: KeyRecord) -> bool:
        return await anyio.to_thread.run_sync(self._add, record)

    async def put(self, record: KeyRecord) -> None:
        await anyio.to_thread.run_sync(self._put, record)

    async def retire(self, key_sha256: str, replaced_by: str, expires: float) -> KeyRecord | None:
        return await anyio.to_thread.run_sync(self._retire, key_sha256, replaced_by, expires)

    async def list_keys(self, user: str | None = None) -> list[KeyRecord]:
        return await anyio.to_thread.run_sync(self._list, user)

    async def page_keys(self, user: str | None, after: str | None, limit: int) -> KeyPage:
        return page_of(await anyio.to_thread.run_sync(self._page, user, after, limit + 1), limit)

    async def any_usable(self, now: float) -> bool:
        return await anyio.to_thread.run_sync(self._any_usable, now)

    async def aclose(self) -> None:
        await anyio.to_thread.run_sync(self._close)

    def _one(self, column: str, value: str) -> KeyRecord | None:
        with self._lock:
            row = self._conn.execute(
                f"SELECT {_COLUMNS} FROM api_keys WHERE {column} = ?", (value,)
            ).fetchone()
        return KeyRecord(*row) if row else None

    def _add(self, record: KeyRecord) -> bool:
        # IGNORE covers both refusals (KeyStore.add): the hash's primary key and the id's UNIQUE.
        with self._lock:
            cursor = self._conn.execute(
                f"INSERT OR IGNORE INTO api_keys ({_COLUMNS}) VALUES ({_PLACES})", _row(record)
            )
        return cursor.rowcount == 1

    def _put(self, record: KeyRecord) -> None:
        # A revocation is final, and so is a replacement (KeyStore.put): the stored one is kept
        # whatever the record says, and with it the expiry its rotation set when the record was
        # read before it (its replaced_by is not the stored one).
        with self._lock:
            self._conn.execute(
                f"INSERT INTO api_keys ({_COLUMNS}) VALUES ({_PLACES}) "
                "ON CONFLICT(key_sha256) DO UPDATE SET id=excluded.id, user=excluded.user, "
                "tier=excluded.tier, label=excluded.label, created=excluded.created, "
                "expires=CASE WHEN api_keys.replaced_by IS NULL "
                "OR api_keys.replaced_by = excluded.replaced_by "
                "THEN excluded.expires ELSE api_keys.expires END, "
                "revoked=COALESCE(api_keys.revoked, excluded.revoked), last4=excluded.last4, "
                "replaced_by=COALESCE(api_keys.replaced_by, excluded.replaced_by), "
                "replaces=COALESCE(api_keys.replaces, excluded.replaces)",
                _row(record),
            )

    def _retire(self, key_sha256: str, replaced_by: str, expires: float) -> KeyRecord | None:
        # Not over a revocation either (KeyStore.retire): the rotation then revokes its new key.
        with self._lock:
            self._conn.execute(
                "UPDATE api_keys SET expires = ?, replaced_by = ? "
                "WHERE key_sha256 = ? AND replaced_by IS NULL AND revoked IS NULL",
                (expires, replaced_by, key_sha256),
            )
        return self._one("key_sha256", key_sha256)

    def _list(self, user: str | None) -> list[KeyRecord]:
        query = f"SELECT {_COLUMNS} FROM api_keys"
        params: tuple[str, ...] = ()
        if user is not None:
            query, params = query + " WHERE user = ?", (user,)
        with self._lock:
            rows = self._conn.execute(query + " ORDER BY created, id", params).fetchall()
        return [KeyRecord(*row) for row in rows]

    def _page(self, user: str | None, after: str | None, want: int) -> list[KeyRecord]:
        # Keyset: the page starts past the cursor's id in the index, never an OFFSET read through.
        where, params = ["id > ?"], [after or ""]
        if user is not None:
            where.append("user = ?")
            params.append(user)
        query = f"SELECT {_COLUMNS} FROM api_keys WHERE {' AND '.join(where)} ORDER BY id LIMIT ?"
        with self._lock:
            rows = self._conn.execute(query, (*params, want)).fetchall()
        return [KeyRecord(*row) for row in rows]

    def _any_usable(self, now: float) -> bool:
        with self._lock:
            found = self._conn.execute(
                "SELECT 1 FROM api_keys WHERE revoked IS NULL AND (expires IS NULL OR expires > ?) LIMIT 1",
                (now,),
            )
            return found.fetchone() is not None

    def _close(self) -> None:
        with self._lock:
            self._conn.close()
