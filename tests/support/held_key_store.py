"""`floodgate` in a child process whose SQLite key store holds a key command at one step until the
process is interrupted: the moments a Ctrl-C leaves a new key stored and unseen.

    python -m tests.support.held_key_store MOMENT keys rotate KEY_ID --config PATH
    python -m tests.support.held_key_store MOMENT keys create --user U --tier T --config PATH

`added`: the new key's insert is held once it has written (its answer not yet back); `before`: the
retire is held before it writes (the old key untouched); `after`: once it has written (the rotation
made, its answer not yet back); `announced`: the new key's announcement to the edges is held (as a
Redis that answers slowly holds it); `closing`: the store's close, the command's work done, is held.
HELD is written to stderr when the hold begins, for the test to send SIGINT then, rather than after
a sleep.
"""

from __future__ import annotations

import asyncio
import sys

from edge import cli
from edge.config import KeysConfig
from edge.keys import cli_support
from edge.keys.record import KeyRecord
from edge.keys.sqlite import SQLiteKeyStore
from edge.keys.store import KeyStore

HELD = "held-key-store: held"
MOMENTS = ("added", "before", "after", "announced", "closing")


async def _hold() -> None:
    print(HELD, file=sys.stderr, flush=True)
    await asyncio.get_running_loop().create_future()  # only a cancellation ends it


class HeldKeyStore(SQLiteKeyStore):
    def __init__(self, path: str, moment: str) -> None:
        super().__init__(path)
        self._moment = moment

    async def add(self, record: KeyRecord) -> bool:
        added = await super().add(record)
        if self._moment == "added":
            await _hold()
        return added

    async def retire(self, key_sha256: str, replaced_by: str, expires: float) -> KeyRecord | None:
        if self._moment not in ("before", "after"):
            return await super().retire(key_sha256, replaced_by, expires)
        stored = None
        if self._moment == "after":
            stored = await super().retire(key_sha256, replaced_by, expires)
        await _hold()
        return stored

    async def aclose(self) -> None:
        try:
            if self._moment == "closing":
                await _hold()
        finally:
            await super().aclose()


class HeldKeyChanges:
    """The announcements of `announced`: the first one is held; the revocation a Ctrl-C makes is
    announced at once."""

    def __init__(self) -> None:
        self._held = False

    async def announce(self, key_sha256: str) -> bool:
        if not self._held:
            self._held = True
            await _hold()
        return True

    async def aclose(self) -> None:
        pass


def main() -> int:
    moment = sys.argv[1]
    assert moment in MOMENTS, moment

    async def open_key_store(config: KeysConfig, *, creates: bool) -> KeyStore:
        return HeldKeyStore(config.sqlite_path, moment)

    # Where the CLI looks it up (cli_support imports it by name).
    vars(cli_support)["open_key_store"] = open_key_store
    if moment == "announced":
        vars(cli_support)["key_changes"] = lambda limiter: HeldKeyChanges()
    return cli.main(sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
