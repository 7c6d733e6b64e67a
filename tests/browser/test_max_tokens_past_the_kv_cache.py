"""A request within the model's context but past every replica's KV cache (a replica smaller than the
context, or the tier's part of one): the edge refuses it with context_length_exceeded, before the
stream opens or, queued for a replica that comes back smaller, in the stream it had opened. The page
gave the Max tokens advice to the context's refusal alone: this one said only "Please reduce the
length of the messages or completion", which names nothing the page lets its user shorten but Max
tokens. It now names the Max tokens that fits, and that Max tokens goes through."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

from playwright.sync_api import Browser, Page, expect

from edge.config import Settings
from edge.upstreams.base import Upstream
from tests.admission.replicas import ControlledUpstream
from tests.edge.conftest import ROOMY_TIERS
from tests.edge.sse_client import wait_until
from tests.support.live_server import LiveServer, start_server

WAIT_MS = 30_000
FITS = re.compile(r"KV cache.*Lower Max tokens to (\d+) or less\.$")
ANY_FITS = re.compile(r"Lower Max tokens to (\d+) or less\.$")  # the context's refusal's, or the cache's


def small(name: str) -> ControlledUpstream:
    """A replica of 64 KV tokens (4 blocks of 16), less than the model's context."""
    return ControlledUpstream(name, kv_tokens_total=64, max_sequences=8, kv_block_tokens=16)


@contextmanager
def playground(
    browser: Browser, tmp_path: Path, *replicas: Upstream, context: int | None = None
) -> Iterator[tuple[LiveServer, Page]]:
    """An edge whose replicas are `replicas` (and whose model's context is `context` tokens, where
    given), and its playground in a browser context of its own."""

    def provider(settings: Settings, model_dir: Path) -> AbstractAsyncContextManager[list[Upstream]]:
        @asynccontextmanager
        async def provide() -> AsyncIterator[list[Upstream]]:
            yield list(replicas)

        return provide()

    overrides: dict[str, Any] = {"tiers": ROOMY_TIERS}
    if context is not None:
        overrides["model"] = {"max_model_len": context}
    with start_server(tmp_path, overrides, provider) as server:
        context = browser.new_context()
        try:
            page = context.new_page()
            page.goto(server.base_url + "/")
            page.fill("#api-key", server.keys["paid"])
            yield server, page
        finally:
            context.close()


def send(page: Page, max_tokens: int) -> None:
    page.fill("#max-tokens", str(max_tokens))
    page.fill("#prompt", "hi")
    page.press("#prompt", "Enter")


def advised_max_tokens(page: Page, fits: re.Pattern[str] = FITS) -> int:
    """The Max tokens the refusal's advice names, once the status shows it."""
    state = page.locator("#status-state")
    expect(state).to_have_attribute("data-state", "error", timeout=WAIT_MS)
    advice = fits.search(state.text_content() or "")
    assert advice, state.text_content()
    return int(advice.group(1))


def goes_through(page: Page, max_tokens: int) -> None:
    expect(page.locator("#prompt")).to_have_value("hi")  # given back with the refusal
    page.fill("#max-tokens", str(max_tokens))
    page.press("#prompt", "Enter")
    state = page.locator("#status-state")
    expect(state).to_have_attribute("data-state", re.compile("done|stopped"), timeout=WAIT_MS)


def test_a_refusal_past_the_kv_cache_says_which_max_tokens_fits(browser: Browser, tmp_path: Path) -> None:
    with playground(browser, tmp_path, small("small")) as (_, page):
        send(page, 100)
        goes_through(page, advised_max_tokens(page))


def test_a_refusal_past_the_kv_cache_in_the_stream_says_which_max_tokens_fits(
    browser: Browser, tmp_path: Path
) -> None:
    large = ControlledUpstream("large", kv_tokens_total=1024, max_sequences=8, kv_block_tokens=16)
    with playground(browser, tmp_path, small("small"), large) as (server, page):
        dispatcher = server.app.state.runtime.pipeline.dispatcher
        large.is_ready, large.restart_eta_s = False, 30.0
        wait_until(
            lambda: any(r.name == "large" and not r.alive for r in dispatcher.replicas.members),
            what="the large replica's restart to be seen",
        )
        opened: list[int] = []
        page.on(
            "response", lambda r: opened.append(r.status) if r.url.endswith("/chat/completions") else None
        )
        send(page, 100)
        wait_until(lambda: dispatcher.queue_depth() == 1, what="the request to queue for the large replica")
        large.kv_tokens_total, large.is_ready, large.restart_eta_s = 64, True, None  # back, smaller
        fits = advised_max_tokens(page)
        assert opened == [200]  # refused in the stream, not before it
        goes_through(page, fits)


def test_a_max_tokens_past_the_context_and_the_kv_cache_is_told_what_fits_both(
    browser: Browser, tmp_path: Path
) -> None:
    """Past the model's context (128) too: the context's refusal named the context's room, itself
    past the replica's 64 tokens, so that the Max tokens it gave was refused again."""
    with playground(browser, tmp_path, small("small"), context=128) as (_, page):
        send(page, 200)
        goes_through(page, advised_max_tokens(page, ANY_FITS))
