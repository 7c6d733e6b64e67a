"""axe-core's serious and critical rules over the real page in each of its states, light and dark.

Text contrast fell short of WCAG AA's 4.5:1 for small text: the grey of the fields' own text and
of "Enter your API key…" (4.4:1 on the page's background), the green "done" (4.4:1) and the orange
"stopped" under a reply (4.4:1); the dark theme's Send was white on a light blue (3.2:1). A reply
left out of the context was greyed by half its opacity, about 3.7:1."""

from __future__ import annotations

import re
from typing import Literal

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.browser.axe import blocking_violations
from tests.browser.conftest import WAIT_MS, PacedReplica, turn
from tests.support.live_server import LiveServer


def faults(page: Page, state: str) -> list[str]:
    return [f"{state}: {line}" for line in blocking_violations(page)]


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_no_state_of_the_page_has_a_serious_axe_violation(
    browser: Browser, paced_server: tuple[LiveServer, PacedReplica], scheme: Literal["light", "dark"]
) -> None:
    server, _ = paced_server
    context = browser.new_context(viewport={"width": 1100, "height": 760}, color_scheme=scheme)
    try:
        page = context.new_page()
        page.goto(server.base_url + "/")
        found = faults(page, "empty page")

        page.fill("#api-key", server.keys["paid"])
        page.check("#remember-key")
        found += faults(page, "key entered")

        turn(page, "hello", 4)
        found += faults(page, "done")

        page.fill("#max-tokens", "2000")
        page.fill("#prompt", "a long story")
        page.click("#send")
        reply = page.locator("#transcript .msg.assistant").last
        expect(reply).to_have_text(re.compile(".{10}"), timeout=WAIT_MS)
        found += faults(page, "streaming")
        page.click("#stop")
        expect(page.locator("#transcript .cut-note")).to_have_count(1, timeout=WAIT_MS)
        found += faults(page, "stopped")

        # The page's own mark of a turn past the context (a real one takes three long turns: see
        # test_long_conversation_leaves_out_its_oldest_turns).
        page.evaluate("nodeOf.get(chat.messages[0]).classList.add('left-out')")
        found += faults(page, "left out")

        page.fill("#api-key", "fg-not-a-key")
        page.fill("#prompt", "refused")
        page.click("#send")
        expect(page.locator("#status-state")).to_have_attribute("data-state", "error", timeout=WAIT_MS)
        found += faults(page, "error")
        assert found == []
    finally:
        context.close()
