"""client/README.md says what auto_retry sends again and how often: it said only "429s waited out",
never `max_retries` nor its default, while a 503 was retried too (and now every 5xx)."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

from floodgate_client import AsyncClient, Client
from floodgate_client.errors import error_from_response
from floodgate_client.retry import retryable

README = Path(__file__).resolve().parents[2] / "client" / "README.md"


def test_the_readme_gives_max_retries_and_its_default() -> None:
    text = " ".join(README.read_text(encoding="utf-8").split())
    stated = re.search(r"at most `max_retries` times \((\d+) by default", text)
    assert stated is not None, "client/README.md does not say max_retries and its default"
    for cls in (Client, AsyncClient):
        assert inspect.signature(cls).parameters["max_retries"].default == int(stated.group(1))


def test_the_readme_names_the_statuses_auto_retry_sends_again() -> None:
    text = " ".join(README.read_text(encoding="utf-8").split())
    named = re.search(r"a 408, 409, 429 or any 5xx", text)
    assert named is not None, "client/README.md does not name the answers auto_retry sends again"
    for status in (408, 409, 429, 500, 502, 503, 504):
        assert retryable(error_from_response(status, {}, b"{}")), status
    for status in (400, 401, 403, 404, 413, 422):
        assert not retryable(error_from_response(status, {}, b"{}")), status
