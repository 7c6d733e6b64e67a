"""Fixtures of the admission tests: a dispatcher over controlled replicas, closed after each test."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import pytest

from edge.admission import Dispatcher
from edge.upstreams.base import Upstream
from tests.admission.flow import counting_clock
from tests.support.admitted import admitter  # noqa: F401  (requests admitted on a real Redis)

MakeDispatcher = Callable[..., AbstractAsyncContextManager[Dispatcher]]


@pytest.fixture
def make_dispatcher() -> MakeDispatcher:
    @asynccontextmanager
    async def make(upstreams: Sequence[Upstream], **options: Any) -> AsyncIterator[Dispatcher]:
        options.setdefault("reserved_paid_fraction", 0.0)
        options.setdefault("max_queue", 1000)
        options.setdefault("clock", counting_clock())
        options.setdefault("poll_interval_s", 0.01)
        dispatcher = Dispatcher(upstreams, **options)
        await dispatcher.start()
        try:
            yield dispatcher
        finally:
            await dispatcher.aclose()

    return make
