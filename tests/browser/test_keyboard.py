"""The playground with the keyboard alone, in a real browser against a real edge whose replica
writes slowly.

Stop, pressed from the keyboard (Tab to it, Enter), disabled itself with the focus on it: the focus
fell to the page, and the next message typed went nowhere; so it did when the reply ended while the
focus waited on Stop. And nothing but Stop stopped a reply: Escape, as in chat apps, did nothing."""

from __future__ import annotations

import re

from playwright.sync_api import Browser, Page, expect

from tests.browser.conftest import WAIT_MS, PacedReplica
from tests.support.live_server import LiveServer

FOCUSED = "document.activeElement && document.activeElement.id"


def start_a_reply(browser: Browser, server: LiveServer, max_tokens: int) -> Page:
    """A page whose reply is streaming, sent with Enter from the message box."""
    page = browser.new_context().new_page()
    page.goto(server.base_url + "/")
    page.fill("#api-key", server.keys["paid"])
    page.fill("#max-tokens", str(max_tokens))
    page.focus("#prompt")
    page.keyboard.type("tell me a story")
    page.keyboard.press("Enter")
    expect(page.locator("#transcript .msg.assistant")).to_have_text(re.compile(".{10}"), timeout=WAIT_MS)
    return page


def test_the_controls_take_the_focus_in_the_order_they_are_shown(page: Page) -> None:
    """New chat (the header's), the settings left to right, the message box, Send; Stop only while
    a reply runs."""
    order = []
    for _ in range(8):
        page.keyboard.press("Tab")
        order.append(page.evaluate(FOCUSED))
    assert order == [
        "new-chat", "api-key", "remember-key", "model", "max-tokens", "temperature", "prompt", "send"
    ]  # fmt: skip


def test_every_control_has_a_name_that_stays_once_text_is_typed(page: Page) -> None:
    """The message box was named by its placeholder alone, which a screen reader may not read as
    its name and which goes once text is typed (axe does not flag it)."""
    page.fill("#prompt", "hello")
    expect(page.get_by_label("Message", exact=True)).to_have_id("prompt")
    for name in ("Key", "Model", "Max tokens"):
        expect(page.get_by_label(name, exact=True)).to_have_count(1)


def test_escape_stops_a_running_reply(
    browser: Browser, paced_server: tuple[LiveServer, PacedReplica]
) -> None:
    server, _ = paced_server
    page = start_a_reply(browser, server, 2000)
    try:
        page.keyboard.press("Escape")
        expect(page.locator("#status-state")).to_have_text("stopped", timeout=WAIT_MS)
        assert page.evaluate(FOCUSED) == "prompt"
    finally:
        page.context.close()


def test_stop_from_the_keyboard_gives_the_focus_back_to_the_message_box(
    browser: Browser, paced_server: tuple[LiveServer, PacedReplica]
) -> None:
    server, _ = paced_server
    page = start_a_reply(browser, server, 2000)
    try:
        page.keyboard.press("Tab")  # Send is disabled meanwhile: the next stop is Stop
        assert page.evaluate(FOCUSED) == "stop"
        page.keyboard.press("Enter")
        expect(page.locator("#status-state")).to_have_text("stopped", timeout=WAIT_MS)
        assert page.evaluate(FOCUSED) == "prompt"
        page.keyboard.type("and then")
        expect(page.locator("#prompt")).to_have_value("and then")
    finally:
        page.context.close()


def test_a_reply_ending_while_the_focus_waits_on_stop_gives_it_back_to_the_message_box(
    browser: Browser, paced_server: tuple[LiveServer, PacedReplica]
) -> None:
    server, _ = paced_server
    page = start_a_reply(browser, server, 100)
    try:
        page.keyboard.press("Tab")
        assert page.evaluate(FOCUSED) == "stop"
        expect(page.locator("#status-state")).to_have_attribute("data-state", "done", timeout=WAIT_MS)
        assert page.evaluate(FOCUSED) == "prompt"
    finally:
        page.context.close()


def test_each_control_shows_where_the_focus_is(page: Page) -> None:
    """An outline on each control the keyboard reaches (the browser's own: nothing turns it off)."""
    for _ in range(8):
        page.keyboard.press("Tab")
        outline = page.evaluate(
            "(() => { const s = getComputedStyle(document.activeElement);"
            " return [document.activeElement.id, s.outlineStyle, parseFloat(s.outlineWidth)]; })()"
        )
        assert outline[1] != "none" and outline[2] > 0, outline
