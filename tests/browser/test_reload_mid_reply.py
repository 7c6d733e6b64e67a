"""A reload in the middle of a reply, in a real browser against a real edge whose replica writes
slowly. The edge stores the turn as `disconnected`, and the page read it back as a failed turn with
no word of why, its question not given back to the box as every other failure's is: the user had
to copy it out of the transcript to send it again. The reloaded page says the reload cut it and
puts the question back."""

from __future__ import annotations

import threading

from playwright.sync_api import Browser, expect

from tests.browser.conftest import WAIT_MS, PacedReplica
from tests.browser.test_stop_without_the_cancel import start_a_long_reply, wait_for_the_stored_reply
from tests.support.live_server import LiveServer


def test_a_reply_cut_by_a_reload_says_so_and_gives_the_question_back(
    browser: Browser, paced_server: tuple[LiveServer, PacedReplica]
) -> None:
    server, _ = paced_server
    context = browser.new_context()
    try:
        page = context.new_page()
        start_a_long_reply(page, server)

        page.reload()
        wait_for_the_stored_reply(page, server)
        page.reload()  # the stored reply read back, whenever the first reload's read came

        expect(page.locator("#transcript .msg.assistant.failed")).to_have_count(1, timeout=WAIT_MS)
        expect(page.locator("#transcript .fail-note")).to_have_text(["interrupted by a reload"])
        expect(page.locator("#prompt")).to_have_value("tell me a long story")
        expect(page.locator("#status-state")).to_have_attribute("data-state", "error")
        assert page.evaluate("chat.messages") == []
    finally:
        context.close()


def test_a_reload_before_the_edge_answered_gives_the_question_back(
    browser: Browser, paced_server: tuple[LiveServer, PacedReplica]
) -> None:
    server, _ = paced_server
    context = browser.new_context()
    try:
        page = context.new_page()
        page.goto(server.base_url + "/")
        page.fill("#api-key", server.keys["paid"])
        page.check("#remember-key")
        # The request held in the browser: nothing of the turn reaches the edge before the reload.
        with page.expect_request("**/v1/chat/completions"):
            page.route("**/v1/chat/completions", lambda route: None)
            page.fill("#prompt", "are you there?")
            page.click("#send")

        page.reload()

        expect(page.locator("#prompt")).to_have_value("are you there?", timeout=WAIT_MS)
        expect(page.locator("#status-state")).to_have_text(
            "last message interrupted by a reload before any reply: it is back in the box to send again"
        )
    finally:
        context.close()


def test_a_reload_read_before_the_edge_stored_the_cut_reply_waits_for_it(
    browser: Browser, paced_server: tuple[LiveServer, PacedReplica]
) -> None:
    """The edge stores a dropped stream's turn once it has seen the drop and closed the request (its
    replica's stream closed first): the reloaded page's read may come before. Read then, the reply
    was missing from the reloaded view, until another reload."""
    server, replica = paced_server
    context = browser.new_context()
    replica.closing = threading.Event()
    try:
        page = context.new_page()
        start_a_long_reply(page, server)

        with page.expect_response("**/messages?*"):
            page.reload()
        replica.closing.set()  # read: now the edge may end the request and store its reply

        expect(page.locator("#transcript .msg.assistant.failed")).to_have_count(1, timeout=WAIT_MS)
        expect(page.locator("#transcript .fail-note")).to_have_text(["interrupted by a reload"])
        expect(page.locator("#prompt")).to_have_value("tell me a long story")
    finally:
        replica.closing.set()
        replica.closing = None
        context.close()
