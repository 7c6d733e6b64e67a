"""A real edge serving the playground, and Debian's Chromium driven by Playwright (never downloaded)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, sync_playwright

from edge.keys.record import ADMIN_KEY_PREFIX, hash_key, new_secret
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

# Two models, as the embedded default serves them: paid keys default to LARGE, which free keys may
# not use (a 404 model_not_found for them). The free user gets one request a minute here, so a
# second send is surely refused (the 429 view). The admin API moves a key to another tier.
SMALL, LARGE = "floodgate-tiny", "floodgate-large"
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
