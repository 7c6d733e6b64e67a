"""Create keys from synchronous code (tests, benchmarks, scripts) whatever event loop is running."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

from edge.config import Settings
from edge.keys.cli_support import opened_lifecycle


def create_keys(settings: Settings, wanted: dict[str, tuple[str, str]]) -> dict[str, str]:
    """{name: (user, tier)} → {name: key}, in the store the settings name. Runs on a loop of its own
    in a worker thread, so a caller already inside an event loop can use it too."""

    async def create() -> dict[str, str]:
        async with opened_lifecycle(settings, creates=True) as keys:
            return {name: (await keys.create(user, tier))[0] for name, (user, tier) in wanted.items()}

    with ThreadPoolExecutor(1) as worker:
        return worker.submit(asyncio.run, create()).result()
