"""The key store, lifecycle and usage store as the CLI opens them for one command."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from typing import TypeVar

from edge.config import Settings
from edge.keys.factory import key_changes, open_key_store
from edge.keys.lifecycle import KeyLifecycle
from edge.usage.factory import open_usage_store
from edge.usage.store import UsageStore

_T = TypeVar("_T")


@asynccontextmanager
async def opened_lifecycle(settings: Settings) -> AsyncIterator[KeyLifecycle]:
    """Changes are announced over the limiter's Redis when it has one, so edges act at once."""
    async with AsyncExitStack() as stack:
        store = await open_key_store(settings.keys)
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
async def opened_usage(settings: Settings) -> AsyncIterator[UsageStore]:
    store = await open_usage_store(settings.keys)
    try:
        yield store
    finally:
        await store.aclose()


def run(step: Callable[[], Awaitable[_T]]) -> _T:
    async def main() -> _T:
        return await step()

    return asyncio.run(main())


def note(message: str) -> None:
    """For the operator, on stderr: stdout stays machine-readable (the key, the CSV)."""
    print(message, file=sys.stderr)
