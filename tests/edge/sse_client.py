"""Reading an SSE chat stream the way a client sees it: comments, JSON events, [DONE]."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx

DONE = "[DONE]"
KEEPALIVE = ": keep-alive"

CHAT = "/v1/chat/completions"
MODEL = "floodgate-tiny"
LONG_PROMPT = [{"role": "user", "content": "hi"}]
# A stream long enough to cancel or abandon midway: this many tokens without an end token.
LONG_TOKENS = 1000
# Seeds to try, most likely first (6 runs long with the demo model as built today).
_SEED_CANDIDATES: tuple[int, ...] = (6, *range(6), *range(7, 40))


def events(response: httpx.Response) -> Iterator[Any]:
    """Each `data:` payload (parsed JSON, or the string "[DONE]") and each comment line, in order."""
    for line in response.iter_lines():
        if line.startswith(":"):
            yield line
        elif line.startswith("data: "):
            data = line[len("data: ") :]
            yield data if data == DONE else json.loads(data)


def content_of(chunks: list[Any]) -> str:
    return "".join(
        c["choices"][0]["delta"].get("content") or ""
        for c in chunks
        if isinstance(c, dict) and c.get("choices")
    )


def wait_until(predicate: Callable[[], bool], timeout_s: float = 10.0, what: str = "condition") -> None:
    """Poll a condition the server exposes (no event to wait on over HTTP), bounded."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def find_long_seed(client: httpx.Client, key: str) -> int:
    """A seed with which LONG_PROMPT runs to LONG_TOKENS: sampling is seeded, so it will again."""
    body = {"model": MODEL, "messages": LONG_PROMPT, "max_tokens": LONG_TOKENS}
    for seed in _SEED_CANDIDATES:
        answer = client.post(CHAT, json=body | {"seed": seed}, headers={"Authorization": f"Bearer {key}"})
        if answer.json()["choices"][0]["finish_reason"] == "length":
            return seed
    raise AssertionError("no seed makes the demo model run long; has it changed?")
