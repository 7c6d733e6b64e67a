"""A request id names the edge process that holds the request.

`chatcmpl-`, this process's tag (8 hex digits, drawn anew in every process), then 16 random hex
digits (64 bits: a request id is not guessable, and a user may cancel only their own anyway). The
fleet knows a member by the same tag (edge/membership/edge_fleet.py), so when a member stops beating
the others know which concurrency slots died with it: those whose request id starts with its
prefix (`holder_prefix`), which admit.lua frees rather than holding them until their leases run out
(limiter/scripts/admit.lua).
"""

from __future__ import annotations

import os
import secrets

PREFIX = "chatcmpl-"
TAG_HEX = 8


def _draw_tag() -> str:
    return secrets.token_hex(TAG_HEX // 2)


_tag = _draw_tag()


def _redraw_after_fork() -> None:
    # A forked child is another process: sharing the parent's tag, either one's death would free
    # the other's slots. (`serve --workers N` spawns, which imports anew; this covers a fork.)
    global _tag
    _tag = _draw_tag()


os.register_at_fork(after_in_child=_redraw_after_fork)


def process_tag() -> str:
    return _tag


def holder_prefix(tag: str) -> str:
    """How every request id that the member tagged `tag` hands out begins."""
    return PREFIX + tag


def new_request_id() -> str:
    return PREFIX + _tag + secrets.token_hex(8)


REFUSAL_PREFIX = "req-"


def new_refusal_id() -> str:
    """The id of a request refused before it became a generation (a 400 for its body, a 401, a
    404, a 413, the door's 429): in its `x-request-id` and its log line, as OpenAI gives every
    answer one, so a user quoting the id of a refusal leads to its line. Not a `chatcmpl-` id: it
    names no completion, and nothing can be cancelled under it."""
    return REFUSAL_PREFIX + _tag + secrets.token_hex(8)
