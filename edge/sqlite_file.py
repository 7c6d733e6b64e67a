"""The edge's SQLite files (keys, usage, messages) are the edge's alone: created readable by their
owner only, whatever the umask. Under the usual 022 they were world-readable (0644): stored
prompts and replies, and the key hashes, open to every account on the host. SQLite gives the
-wal and -shm files it makes the database file's permissions."""

from __future__ import annotations

import contextlib
import os
import sqlite3
from pathlib import Path


def create_private(path: str | Path) -> None:
    """Make the database file (and its directory) if missing, mode 0600; an existing file is left
    as its operator made it. ":memory:" is no file."""
    if str(path) == ":memory:":
        return
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:
        return
    os.close(fd)


# How long the open check waits for a file another writer holds (sqlite3's own default): a busy file
# is one that opens (`_write_lock`), and its store then waits its own turn.
OPEN_CHECK_WAIT_S = 5.0


def unopenable(files: dict[str, str]) -> str | None:
    """The first of `files` (setting name: path) that cannot be made and opened, said with its
    setting, else None. A path under a file, in a directory the edge may not write, or naming a
    directory was an OSError or sqlite3.OperationalError traceback from the store's open: at
    `serve`'s start (after the model's import) and from every `floodgate keys` command."""
    for setting, path in files.items():
        try:
            create_private(path)
            with contextlib.closing(
                sqlite3.connect(path, isolation_level=None, timeout=OPEN_CHECK_WAIT_S)
            ) as db:
                # Connect alone opens nothing yet, and a file it may read but not write (another
                # account's, a read-only mount) opens read-only: the stores' first step, WAL mode,
                # and a write lock are what they need, taken and let go here.
                db.execute("PRAGMA journal_mode=WAL")
                _write_lock(db)
        except (OSError, sqlite3.Error) as exc:
            return f"{setting} {path!r}: cannot open it: {exc}"
    return None


def _write_lock(db: sqlite3.Connection) -> None:
    """Take the write lock and let it go. A file busy with another writer (an edge, while `floodgate
    keys` runs) is one that opens: its store waits its turn as it always does."""
    try:
        db.execute("BEGIN IMMEDIATE")
    except sqlite3.OperationalError as exc:
        if getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_BUSY:
            return
        raise
    db.execute("ROLLBACK")


def add_columns(conn: sqlite3.Connection, table: str, columns: tuple[str, ...], kind: str = "TEXT") -> None:
    """Bring a table an older edge made up to this schema: each of `columns` (of type `kind`) it lacks is
    added (CREATE TABLE IF NOT EXISTS leaves an existing table as it was). Edges, their workers and
    the CLI of one host may open the file at once: the loser of the race to add a column finds it
    there, which is all this wants."""
    present = {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}
    for column in columns:
        if column in present:
            continue
        try:
            conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")
        except sqlite3.OperationalError as exc:
            if "duplicate column" not in str(exc):
                raise
