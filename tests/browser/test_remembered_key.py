"""Where the page keeps a pasted key, as its "remember" box says and the README documents: in the
tab's memory only (a reload forgets it) unless "remember" is ticked, then in the browser's
localStorage for this origin until unticked. The box said only "remember", nowhere where or how (a
review: a user on a shared computer could not tell the key stayed on disk in plain text). Then it
said so in a hover title alone, which touch and keyboard users never see: it is visible text now."""

from __future__ import annotations

import re

from playwright.sync_api import Browser, Page, expect

from tests.support.live_server import LiveServer

STORED = "() => Object.entries(localStorage)"
SAYS_WHERE = re.compile(r"localStorage.*plain\s+text.*reload\s+forgets it", re.DOTALL)


def test_the_remember_box_says_where_the_key_is_kept_to_keyboard_users(page: Page) -> None:
    """Said in a hover title, which a keyboard (or a touch) never shows: its text is now the box's
    description, shown while the box has the focus."""
    box = page.locator("#remember-key")
    note = page.locator("#remember-note")
    expect(box).to_have_accessible_description(SAYS_WHERE)
    expect(note).to_be_hidden()  # out of the way until the box is reached
    page.focus("#api-key")
    page.keyboard.press("Tab")
    expect(box).to_be_focused()
    expect(note).to_be_visible()
    expect(note).to_have_text(SAYS_WHERE)


def test_the_remember_box_says_where_the_key_is_kept_to_touch_users(
    browser: Browser, page_server: LiveServer
) -> None:
    context = browser.new_context(has_touch=True, is_mobile=True, viewport={"width": 390, "height": 760})
    try:
        page = context.new_page()
        page.goto(page_server.base_url + "/")
        page.tap("#remember-key")
        expect(page.locator("#remember-key")).to_be_checked()
        expect(page.locator("#remember-note")).to_be_visible()
        expect(page.locator("#remember-note")).to_have_text(SAYS_WHERE)
    finally:
        context.close()


def test_the_key_is_kept_only_while_remember_is_ticked(page: Page, page_server: LiveServer) -> None:
    key = page_server.keys["paid"]
    page.fill("#api-key", key)
    page.press("#api-key", "Tab")
    assert page.evaluate(STORED) == []
    page.reload()
    expect(page.locator("#api-key")).to_have_value("")

    page.fill("#api-key", key)
    page.check("#remember-key")
    assert page.evaluate(STORED) == [["floodgate.apiKey", key]]
    page.reload()
    expect(page.locator("#api-key")).to_have_value(key)
    expect(page.locator("#remember-key")).to_be_checked()

    page.uncheck("#remember-key")
    assert page.evaluate(STORED) == []
