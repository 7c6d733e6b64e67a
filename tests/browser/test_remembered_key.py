"""Where the page keeps a pasted key, as its "remember" box says and the README documents: in the
tab's memory only (a reload forgets it) unless "remember" is ticked, then in the browser's
localStorage for this origin until unticked. The box said only "remember", nowhere where or how (a
review: a user on a shared computer could not tell the key stayed on disk in plain text)."""

from __future__ import annotations

import re

from playwright.sync_api import Page, expect

from tests.support.live_server import LiveServer

STORED = "() => Object.entries(localStorage)"


def test_the_remember_box_says_where_the_key_is_kept(page: Page) -> None:
    label = page.locator("label", has=page.locator("#remember-key"))
    expect(label).to_have_attribute("title", re.compile("localStorage.*plain text"))


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
