"""Everything keys and usage need for the life of the app, opened and closed in the right order."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass

import structlog

from edge.config import Settings
from edge.keys.authenticator import Authenticator
from edge.keys.factory import key_changes, open_key_store
from edge.keys.lifecycle import KeyLifecycle
from edge.keys.stream_watch import StreamWatch
from edge.usage.factory import open_usage_store
from edge.usage.store import UsageStore
from edge.usage.writer import UsageWriter

log = structlog.get_logger("floodgate.keys")


@dataclass(frozen=True, slots=True)
class KeyServices:
    authenticator: Authenticator
    # The running streams by key: each ends when its key stops being active.
    streams: StreamWatch
    lifecycle: KeyLifecycle
    usage_store: UsageStore
    usage_writer: UsageWriter


@asynccontextmanager
async def open_key_services(settings: Settings) -> AsyncIterator[KeyServices]:
    """Enter it before anything that runs requests: leaving it last writes every usage row queued
    by the requests that ended before."""
    async with AsyncExitStack() as stack:
        cfg = settings.keys
        store = await open_key_store(cfg, creates=True)
        stack.push_async_callback(store.aclose)
        authenticator = Authenticator(store, cfg.cache_ttl_s)
        streams = StreamWatch(authenticator)
        stack.push_async_callback(streams.aclose)

        def changed(key_sha256: str | None) -> None:
            # The next request reads the store, and the key's running streams are looked at now.
            authenticator.invalidate(key_sha256)
            streams.changed(key_sha256)

        changes = key_changes(settings.limiter)
        if changes is not None:
            stack.push_async_callback(changes.aclose)
            changes.start(changed)

        async def announce(key_sha256: str) -> bool:
            # A change made through this edge's admin API holds here at once, and on the others
            # at once with Redis, else within the cache TTL.
            changed(key_sha256)
            if changes is not None and not await changes.announce(key_sha256):
                log.warning("key_change_announce_failed", bound_s=cfg.cache_ttl_s)
                return False
            return True

        lifecycle = KeyLifecycle(
            store, settings.tiers, rotation_grace_s=cfg.rotation_grace_s, announce=announce
        )
        # Announced: the other edges may have been asked with a key new in the file (a task that
        # starts with a newer secret) and cache it as unknown.
        imported = await lifecycle.import_keys_file(settings.server.keys_file)
        if imported.added:
            log.info("keys_imported", file=settings.server.keys_file, added=imported.added)
        usage_store = await open_usage_store(cfg, creates=True)
        stack.push_async_callback(usage_store.aclose)
        writer = UsageWriter(usage_store, cfg.usage_queue_size)
        writer.start()
        stack.push_async_callback(writer.aclose)
        yield KeyServices(authenticator, streams, lifecycle, usage_store, writer)
