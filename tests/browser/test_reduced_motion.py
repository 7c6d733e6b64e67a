"""The cursor that blinks at a streaming reply's end, for a reader who asked the system for less
motion (prefers-reduced-motion): it blinked all the same, twice a second for the whole reply. It
now stands still for them, and blinks for everyone else."""

from __future__ import annotations

import re
from typing import Literal

import pytest
from playwright.sync_api import Browser, expect

from tests.browser.conftest import WAIT_MS, PacedReplica
from tests.support.live_server import LiveServer

CURSOR_ANIMATION = "getComputedStyle(document.querySelector('.msg.assistant'), '::after').animationName"


@pytest.mark.parametrize(("motion", "animation"), [("reduce", "none"), ("no-preference", "blink")])
def test_the_streaming_cursor_blinks_only_for_readers_who_did_not_ask_for_less_motion(
    browser: Browser,
    paced_server: tuple[LiveServer, PacedReplica],
    motion: Literal["reduce", "no-preference"],
    animation: str,
) -> None:
    server, _ = paced_server
    context = browser.new_context(reduced_motion=motion)
    try:
        page = context.new_page()
        page.goto(server.base_url + "/")
        page.fill("#api-key", server.keys["paid"])
        page.fill("#max-tokens", "2000")
        page.fill("#prompt", "tell me a story")
        page.click("#send")
        reply = page.locator("#transcript .msg.assistant.streaming")
        expect(reply).to_have_text(re.compile(".{10}"), timeout=WAIT_MS)
        assert page.evaluate(CURSOR_ANIMATION) == animation
        page.keyboard.press("Escape")
        expect(page.locator("#status-state")).to_have_text("stopped", timeout=WAIT_MS)
    finally:
        context.close()
