"""Closing a token stream early: the Upstream protocol's way to cancel a generation."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any


async def aclose_stream(stream: AsyncIterator[Any]) -> None:
    """Close the stream now rather than when it is garbage-collected (which may be much later)."""
    if isinstance(stream, AsyncGenerator):
        await stream.aclose()
