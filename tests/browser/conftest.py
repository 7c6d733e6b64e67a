"""A real edge serving the playground, and Debian's Chromium driven by Playwright (never downloaded)."""

from __future__ import annotations

import asyncio
import os
import re
import threading
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import httpx
import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright
from tokenizers import Tokenizer

from edge.config import Settings
from edge.keys.record import ADMIN_KEY_PREFIX, hash_key, new_secret
from edge.upstreams.base import Capacity, Delta, GenerationRequest, Upstream
from tests.client.live import OVERRIDES
from tests.support.live_server import LiveServer, demo_model_dir, start_server
from tests.support.ports import free_port

# Chromium's headless shell (Debian's chromium-headless-shell; what Playwright itself launches for
# headless runs): the same Blink, V8 and network stack without the desktop browser around them. The
# full browser's `--headless` spent three times the CPU on the same pages: tests/browser took 161
# CPU-seconds of Chromium processes against 53 (89 tests all passing in both; 102 s against 56 s
# on a 2-core Xeon, process accounting), about a tenth of the whole suite's CPU.
CHROMIUM = Path("/usr/bin/chromium-headless-shell")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SCREENSHOTS = Path(__file__).resolve().parents[2] / "test-output"

# Two models, as the embedded default serves them: paid keys default to LARGE, which free keys may
# not use (a 404 model_not_found for them). The free user gets one request a minute here, so a
# second send is surely refused (the 429 view). The admin API moves a key to another tier.
SMALL, LARGE = "floodgate-tiny", "floodgate-large"
# A page script: the stats rounds begun so far (window.roundsBegun), and the last-begun of those
# that have ended (window.lastRoundEnded).
NUMBER_ROUNDS = """() => {
  window.roundsBegun = 0;
  window.lastRoundEnded = 0;
  const pageLoadStats = loadStats;
  loadStats = async () => {
    const round = ++window.roundsBegun;
    try { await pageLoadStats(); } finally { window.lastRoundEnded = Math.max(window.lastRoundEnded, round); }
  };
}"""


# How long a page test waits for what a turn shows; a turn's end, as the status says it.
WAIT_MS = 30_000
ENDED = re.compile("done|stopped")


def turn(page: Page, prompt: str, max_tokens: int) -> None:
    """Send `prompt` from the page and wait for its reply's end: its question shown first, since the
    status may read "done" or "stopped" already, from the turn before."""
    questions = page.locator("#transcript .msg.user")
    asked = questions.count()
    page.fill("#max-tokens", str(max_tokens))
    page.fill("#prompt", prompt)
    page.click("#send")
    expect(questions).to_have_count(asked + 1, timeout=WAIT_MS)
    expect(page.locator("#status-state")).to_have_attribute("data-state", ENDED, timeout=WAIT_MS)


def send_from_the_page(page: Page, base_url: str, prompt: str) -> None:
    """Open the playground at `base_url` (a scripted edge: any key does) and send `prompt` to SMALL."""
    page.goto(base_url + "/")
    page.fill("#api-key", "fg-test")
    page.fill("#model", SMALL)
    page.fill("#prompt", prompt)
    page.click("#send")


ADMIN_KEY = new_secret(ADMIN_KEY_PREFIX)
BROWSER_OVERRIDES: dict[str, Any] = {
    "models": {SMALL: {"source": "demo"}, LARGE: {"source": "demo"}},
    "tiers": {
        "paid": {**OVERRIDES["tiers"]["paid"], "models": [LARGE, SMALL], "default_model": LARGE},
        "free": {
            **OVERRIDES["tiers"]["free"],
            "request_window_s": 60.0,
            "models": [SMALL],
            "default_model": SMALL,
        },
    },
    "keys": {"admin_key_sha256": hash_key(ADMIN_KEY)},
}


def fresh_key(server: LiveServer, tier: str, user: str) -> str:
    """A key of a user of its own, made through the admin API. page_server is shared by every file
    of this package that one test process runs: a test that spends the free user's one request a
    minute on `keys["free"]` left the next such test's first send refused, depending on which files
    the process drew."""
    with httpx.Client(base_url=server.base_url, timeout=10.0) as admin:
        made = admin.post(
            "/v1/admin/keys",
            json={"user": f"{user}-{uuid.uuid4().hex[:8]}", "tier": tier},
            headers={"Authorization": f"Bearer {ADMIN_KEY}"},
        )
    assert made.status_code == 201, made.text
    return str(made.json()["key"])


@pytest.fixture(scope="package")
def page_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with start_server(tmp_path_factory.mktemp("edge-page"), overrides=BROWSER_OVERRIDES) as live:
        yield live


@pytest.fixture(scope="package")
def storeless_page_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """An edge whose limiter store is down (nothing listens on its Redis port) and whose paid tier
    fails closed: each of its chat requests is a 503 with a Retry-After."""
    overrides = {
        "limiter": {"backend": "redis", "redis_url": f"redis://127.0.0.1:{free_port()}/0", "timeout_ms": 100},
        "tiers": {**OVERRIDES["tiers"], "paid": {**OVERRIDES["tiers"]["paid"], "on_store_failure": "closed"}},
    }
    with start_server(tmp_path_factory.mktemp("edge-page-storeless"), overrides=overrides) as live:
        yield live


class PacedReplica:
    """A replica that writes a token every PACE_S, as a real model does under load, until its
    max_new_tokens or until the edge closes the stream. The demo engine answers a whole long reply
    in about a second: too soon for streams to hold the browser's connections while a test looks."""

    PACE_S = 0.02
    name = "paced-0"

    def __init__(self) -> None:
        tokenizer = Tokenizer.from_file(str(demo_model_dir() / "tokenizer.json"))
        self.text_ids = tokenizer.encode(" Once upon a time a dragon slept, and dreamt.").ids
        self.running = 0  # streams generating now
        self.cut = 0  # streams the edge closed before their end (a cancel or a disconnect)
        # Set by a test: a closed stream's end waits until the test sets it, as a remote replica's
        # abort waits for its network; the edge stores the turn only after that end.
        self.closing: threading.Event | None = None

    def generate(self, req: GenerationRequest) -> AsyncIterator[Delta]:
        return self._generate(req)

    async def _generate(self, req: GenerationRequest) -> AsyncIterator[Delta]:
        self.running += 1
        last = req.max_new_tokens - 1
        try:
            for k in range(req.max_new_tokens):
                await asyncio.sleep(self.PACE_S)
                yield Delta([self.text_ids[k % len(self.text_ids)]], "length" if k == last else None)
        except (GeneratorExit, asyncio.CancelledError):  # closed, or its consumer cancelled
            self.cut += 1
            closing = self.closing
            if closing is not None:
                with anyio.CancelScope(shield=True):
                    await anyio.to_thread.run_sync(closing.wait)
            raise
        finally:
            self.running -= 1

    async def capacity(self) -> Capacity:
        return Capacity(1_000_000, 0, 64, self.running, 0, 16)

    async def ready(self) -> bool:
        return True

    async def aclose(self) -> None:
        return None


@pytest.fixture(scope="package")
def paced_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveServer, PacedReplica]]:
    """An edge whose one replica is a PacedReplica."""
    replica = PacedReplica()

    def provider(settings: Settings, model_dir: Path) -> AbstractAsyncContextManager[list[Upstream]]:
        @asynccontextmanager
        async def provide() -> AsyncIterator[list[Upstream]]:
            yield [replica]

        return provide()

    with start_server(tmp_path_factory.mktemp("edge-paced"), OVERRIDES, provider) as live:
        yield live, replica


@pytest.fixture(scope="package")
def browser() -> Iterator[Browser]:
    if not (CHROMIUM.is_file() and os.access(CHROMIUM, os.X_OK)):
        pytest.skip(f"Chromium is not installed at {CHROMIUM} (make system-deps installs it)")
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture(scope="session")
def screenshots() -> Path:
    SCREENSHOTS.mkdir(exist_ok=True)
    return SCREENSHOTS


@pytest.fixture
def page(browser: Browser, page_server: LiveServer) -> Iterator[Page]:
    """The playground in a browser context of its own, loaded from `page_server`."""
    context = browser.new_context(viewport={"width": 1100, "height": 760})
    page = context.new_page()
    page.goto(page_server.base_url + "/")
    yield page
    context.close()
