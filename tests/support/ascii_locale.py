"""A C locale without Python's UTF-8 coercion: stdin, stdout, arguments and the default file
encoding are ASCII. What the tests run under it to show a command takes and gives UTF-8 whatever
the locale (a user named zoë, a path /café, the demo tokenizer's pieces)."""

from __future__ import annotations

import os
from pathlib import Path

ASCII_LOCALE = {"LC_ALL": "C", "LANG": "C", "PYTHONCOERCECLOCALE": "0", "PYTHONUTF8": "0"}
REPO = Path(__file__).resolve().parents[2]


def ascii_locale_env() -> dict[str, str]:
    """The environment with ASCII_LOCALE, running this checkout's code (PYTHONPATH), wherever the
    environment's editable install points."""
    return os.environ | ASCII_LOCALE | {"PYTHONPATH": str(REPO)}
