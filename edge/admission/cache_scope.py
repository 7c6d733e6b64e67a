"""Whose prefix cache a request may hit: the cache salt the edge gives each request.

A replica's prefix cache reports what it reused (usage.prompt_tokens_details.cached_tokens), so a
cache shared by all users lets one user learn whether another recently sent a given prompt prefix:
send a guess, read cached_tokens. OpenAI keeps its prompt caches per organization for this reason.
Scope "user" salts every request with its user, so requests of different users never share a cached
block (GenerationRequest.cache_salt); "shared" sends no salt, for a single-tenant deployment whose
users share a long system prompt and would rather not recompute it each.

The salt is a hash of the user id, never the API key: it travels to the replicas and may show up in
their logs, where it names no one.
"""

from __future__ import annotations

import hashlib
from typing import Literal

PrefixCacheScope = Literal["user", "shared"]


def cache_salt(user: str, scope: PrefixCacheScope) -> str:
    """The salt of a request of this user: "" (shared with everyone) or one of the user's own."""
    if scope == "shared":
        return ""
    return hashlib.blake2b(user.encode(), digest_size=16, person=b"floodgate-salt").hexdigest()
