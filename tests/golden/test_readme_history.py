"""The README's "Conversation history" example, run as written against an edge serving the real
default model: its curl's request, and the page it shows (the fields of each message and of the
list, and the model named on the assistant's turn, which must be one `make serve` serves)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx

from tests.support.live_server import LiveServer

README = Path(__file__).resolve().parents[2] / "README.md"


def _history_example() -> tuple[str, str]:
    """The sh block under "Conversation history" that reads a conversation: (its URL, its comment)."""
    section = README.read_text().split("## Conversation history", 1)[1].split("\n## ", 1)[0]
    for block in re.findall(r"```sh\n(.*?)```", section, re.S):
        if "/messages" in block:
            url = re.search(r"curl '([^']+)'", block)
            assert url is not None, block
            comment = "\n".join(line[2:] for line in block.splitlines() if line.startswith("# "))
            return url.group(1), comment
    raise AssertionError("no history example in the README")


def _documented_keys(fragment: str) -> list[str]:
    return re.findall(r'"(\w+)":', fragment)


def test_the_history_example_shows_what_the_edge_answers(local_edge: LiveServer) -> None:
    url, shown = _history_example()
    conversation = url.split("/v1/conversations/", 1)[1].split("/", 1)[0]
    for question in ("Hi", "And then?"):
        httpx.post(
            local_edge.base_url + "/v1/chat/completions",
            headers=local_edge.auth("paid"),
            json={
                "max_tokens": 4,
                "conversation_id": conversation,
                "messages": [{"role": "user", "content": question}],
            },
            timeout=120.0,
        ).raise_for_status()

    here = url.replace("http://127.0.0.1:8000", local_edge.base_url)
    answer = httpx.get(here, headers=local_edge.auth("paid"), timeout=30.0)
    assert answer.status_code == 200, answer.text
    page = answer.json()
    user, assistant = page["data"]

    # The user's turn is shown whole; the assistant's with its role and model, then "…".
    user_shown = re.search(r'\{"id": "01K…", "role": "user".*?\}', shown, re.S)
    assistant_shown = re.search(r'\{"id": "01K…", "role": "assistant"[^}]*', shown)
    assert user_shown is not None and assistant_shown is not None, shown
    assert _documented_keys(user_shown.group(0)) == list(user)
    assert json.loads(user_shown.group(0).replace("…", ""), strict=False)["model"] is user["model"] is None
    model = re.search(r'"model": "([^"]+)"', assistant_shown.group(0))
    assert model is not None and model.group(1) == assistant["model"] == local_edge.settings.model.name
    outer = re.sub(r'"data": \[.*\],', "", shown, flags=re.S)
    assert set(_documented_keys(outer)) == set(page) - {"data"}
    assert page["has_more"] is True
