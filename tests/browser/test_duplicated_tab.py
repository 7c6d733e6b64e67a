"""A duplicated tab, in a real browser against a real edge. The browser copies a tab's
sessionStorage into its duplicate (Chrome's "Duplicate", and a window.open of the page, which this
test uses), so both tabs held one conversation id: each tab's next turn went out with the other's
turns as its context, and the history read back after a reload was the two tabs' turns mixed. The
duplicate now starts as a copy of the conversation and goes on in one of its own."""

from __future__ import annotations

from playwright.sync_api import Page, expect

from tests.browser.conftest import WAIT_MS, fresh_key, turn
from tests.browser.test_reload_keeps_the_conversation import sent_messages
from tests.support.live_server import LiveServer


def test_a_duplicated_tab_goes_on_in_a_conversation_of_its_own(page: Page, page_server: LiveServer) -> None:
    page.fill("#api-key", fresh_key(page_server, "paid", "duplicate"))
    page.check("#remember-key")
    page.fill("#max-tokens", "8")
    turn(page, "first question", 8)
    shown = page.locator("#transcript .msg").all_text_contents()

    with page.context.expect_page() as opened:
        page.evaluate("() => { window.open(location.href); }")
    copy = opened.value
    expect(copy.locator("#transcript .msg")).to_have_text(shown, timeout=WAIT_MS)
    turn(copy, "asked in the copy", 8)
    in_the_copy = copy.locator("#transcript .msg").all_text_contents()
    assert copy.evaluate("chat.conversationId") != page.evaluate("chat.conversationId")

    # The original goes on without the copy's turn, and the copy keeps its own after a reload.
    sent = sent_messages(page, "asked in the original")
    assert [m["content"] for m in sent] == ["first question", shown[1], "asked in the original"]
    copy.reload()
    expect(copy.locator("#transcript .msg")).to_have_text(in_the_copy, timeout=WAIT_MS)
    expect(copy.locator("#transcript .msg.failed")).to_have_count(0)
    assert copy.evaluate("chat.messages.map(m => m.content)") == in_the_copy
    page.reload()
    expect(page.locator("#transcript .msg.user")).to_have_text(
        ["first question", "asked in the original"], timeout=WAIT_MS
    )
