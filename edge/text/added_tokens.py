"""Finding a tokenizer's added tokens (its special tokens among them) in text, as it does.

The tokenizer splits its input at every added token's text before anything else, the longest
first where several start at one position. edge/text/piece_cache.py splits prompts the same way,
and edge/text/content_as_text.py finds the ones a caller typed."""

from __future__ import annotations

import re
from collections.abc import Iterable


def added_token_pattern(texts: Iterable[str]) -> re.Pattern[str]:
    """A pattern matching any of the added tokens' texts, the longest first."""
    return re.compile("|".join(re.escape(t) for t in sorted(texts, key=len, reverse=True)))
