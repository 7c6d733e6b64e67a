"""A prompt of several lines, refused (here a mistyped key), is given back to the box: the box had
shrunk to one line as the prompt left it and stayed so, showing one line of six, the rest scrolled
out of sight (a review). It grows to the prompt's lines again, as when it was typed."""

from __future__ import annotations

from playwright.sync_api import Page, expect

WAIT_MS = 30_000
LINES = ["line 1", "line 2", "line 3", "line 4", "line 5", "last line"]
HEIGHT = "() => document.getElementById('prompt').clientHeight"


def test_a_refused_prompt_of_several_lines_comes_back_whole_in_sight(page: Page) -> None:
    page.fill("#api-key", "fg-not-a-real-key")
    page.click("#prompt")
    for line in LINES[:-1]:
        page.keyboard.type(line)
        page.keyboard.press("Shift+Enter")
    page.keyboard.type(LINES[-1])
    typed = int(page.evaluate(HEIGHT))
    page.keyboard.press("Enter")
    expect(page.locator("#status-state")).to_contain_text("HTTP 401", timeout=WAIT_MS)
    expect(page.locator("#prompt")).to_have_value("\n".join(LINES))
    assert int(page.evaluate(HEIGHT)) == typed
