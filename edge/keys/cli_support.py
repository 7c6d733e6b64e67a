"""The key store, lifecycle and usage store as the CLI opens them for one command."""

from __future__ import annotations

import argparse
import asyncio
import os
import sqlite3
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from typing import TypeVar

from botocore.exceptions import BotoCoreError, ClientError

from edge.config import KeysConfig, Settings
from edge.keys.factory import key_changes, open_key_store
from edge.keys.lifecycle import KeyLifecycle
from edge.usage.factory import open_usage_store
from edge.usage.store import UsageStore

_T = TypeVar("_T")


@asynccontextmanager
async def opened_lifecycle(settings: Settings, *, creates: bool) -> AsyncIterator[KeyLifecycle]:
    """Changes are announced over the limiter's Redis when it has one, so edges act at once.
    `creates`: whether a missing store may be made (edge/keys/factory.py)."""
    async with AsyncExitStack() as stack:
        store = await open_key_store(settings.keys, creates=creates)
        stack.push_async_callback(store.aclose)
        try:
            changes = key_changes(settings.limiter)
        except ValueError:  # e.g. the deployment's redis_url, whose token is spliced in inside the task
            changes = None
        if changes is not None:
            stack.push_async_callback(changes.aclose)

        async def announce(key_sha256: str) -> bool:
            if changes is not None and not await changes.announce(key_sha256):
                note(f"(Redis unreachable: the edges see this change within keys.cache_ttl_s = {ttl:g} s)")
                return False
            return True

        ttl = settings.keys.cache_ttl_s
        lifecycle = KeyLifecycle(
            store, settings.tiers, rotation_grace_s=settings.keys.rotation_grace_s, announce=announce
        )
        # The legacy keys file counts as stored keys (the edges import it at start).
        await lifecycle.import_keys_file(settings.server.keys_file)
        yield lifecycle


@asynccontextmanager
async def opened_usage(settings: Settings, *, creates: bool) -> AsyncIterator[UsageStore]:
    store = await open_usage_store(settings.keys, creates=creates)
    try:
        yield store
    finally:
        await store.aclose()


def run(step: Callable[[], Awaitable[_T]], keys: KeysConfig) -> _T:
    """`step` on a fresh event loop. A DynamoDB key store that fails it (its table missing or
    mistyped, no AWS region or credentials in the operator's shell, the endpoint unreachable) is
    said in one line naming the table: botocore's exception was a traceback from every key command,
    `usage` and `serve`'s dev key. So is a SQLite one that fails it: a file another process holds
    the write lock of past the store's busy wait ("database is locked"), a full disk, were a
    sqlite3.OperationalError traceback."""

    async def main() -> _T:
        return await step()

    try:
        return asyncio.run(main())
    except (BotoCoreError, ClientError) as exc:
        table = keys.dynamodb_table
        said = f"floodgate: the key store (DynamoDB table {table!r}): {exc}"
        missing = isinstance(exc, ClientError) and exc.response.get("Error", {}).get("Code") == (
            "ResourceNotFoundException"
        )
        if missing and keys.dynamodb_endpoint:
            # Only the commands that add keys make it at a local endpoint (edge/keys/factory.py).
            said += "; `floodgate keys create` or `floodgate serve` makes it at keys.dynamodb_endpoint"
        raise SystemExit(said) from None
    except sqlite3.Error as exc:
        raise SystemExit(f"floodgate: keys.sqlite_path {keys.sqlite_path!r}: {exc}") from None


def drop_stdout() -> None:
    """Standard output onto /dev/null, once a write to it failed (its reader gone, a full disk):
    what is left in its buffer would fail again at the interpreter's exit, a second error
    ("Exception ignored ... BrokenPipeError") after the one said."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    finally:
        os.close(devnull)


def note(message: str) -> None:
    """For the operator, on stderr: stdout stays machine-readable (the key, the CSV)."""
    print(message, file=sys.stderr)


def write_data(text: str) -> None:
    """Machine-readable output (the CSV) on stdout in UTF-8, whatever the locale: under an ASCII
    one (C, without Python's UTF-8 coercion) the first name beyond ASCII raised UnicodeEncodeError,
    a traceback after the rows before it, where a "?" in its place would be a wrong name."""
    buffer = getattr(sys.stdout, "buffer", None)
    if buffer is None:  # a stream of text only (a caller's own): it takes str as it is
        sys.stdout.write(text)
        return
    sys.stdout.flush()  # what went before, first
    buffer.write(text.encode("utf-8"))
    buffer.flush()


def say(line: str) -> None:
    """A line for a person on stdout, with what its encoding cannot say as "?": under an ASCII
    locale (C, without Python's UTF-8 coercion) a table's ellipsis or a user's name raised
    UnicodeEncodeError, a traceback instead of the listing."""
    encoding = sys.stdout.encoding or "utf-8"
    print(line.encode(encoding, errors="replace").decode(encoding))


def typed_text(argument: str) -> str:
    """An argparse `type` for text that is data (a user's name, a label): as the terminal sent it,
    UTF-8. Under a locale that is not UTF-8 (C, without Python's UTF-8 coercion) Python decoded the
    argument as ASCII and handed "zo\u00eb" on as lone surrogates, which the key store could not
    encode: `keys create --user zo\u00eb` ended in a UnicodeEncodeError traceback."""
    try:
        argument.encode("utf-8")
        return argument
    except UnicodeEncodeError:
        pass
    try:
        return os.fsencode(argument).decode("utf-8")
    except UnicodeError:
        raise argparse.ArgumentTypeError("not valid UTF-8") from None
