"""A real edge serving the playground, and Debian's Chromium driven by Playwright (never downloaded)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, sync_playwright

from tests.client.live import OVERRIDES
from tests.support.live_server import LiveServer, start_server

CHROMIUM = Path("/usr/bin/chromium")
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

# The free user gets one request a minute here, so a second send is surely refused (the 429 view).
BROWSER_OVERRIDES: dict[str, Any] = {
    "tiers": {**OVERRIDES["tiers"], "free": {**OVERRIDES["tiers"]["free"], "request_window_s": 60.0}}
}


@pytest.fixture(scope="package")
def page_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with start_server(tmp_path_factory.mktemp("edge-page"), overrides=BROWSER_OVERRIDES) as live:
        yield live


@pytest.fixture(scope="package")
def browser() -> Iterator[Browser]:
    if not (CHROMIUM.is_file() and os.access(CHROMIUM, os.X_OK)):
        pytest.skip("Chromium is not installed at /usr/bin/chromium (make system-deps installs it)")
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture(scope="session")
def screenshots() -> Path:
    SCREENSHOTS.mkdir(exist_ok=True)
    return SCREENSHOTS
