"""`floodgate config show`: the effective settings as TOML, with every secret masked.

What counts as a secret is decided by shape, not by a list of today's fields, so a setting added
later is masked too: a URL's password (`redis://:token@host`, or `?password=token`, which redis-py
reads too), and any value whose name says it is a credential or a credential's hash (`*password*`,
`*secret*`, `*_sha256`, `*auth_token*`, `*api_key*`), as a setting or as a URL's query parameter.
"""

from __future__ import annotations

import json
import re
from typing import Any
from urllib.parse import SplitResult, parse_qsl, urlencode, urlsplit, urlunsplit

import msgspec

from edge.config import Settings

MASK = "****"
_SECRET_NAME = re.compile(r"password|secret|_sha256$|auth_token|api_key", re.IGNORECASE)


def _mask_url(value: str) -> str:
    try:
        parts = urlsplit(value)
    except ValueError:
        return value
    if not parts.scheme or "://" not in value:
        # Not a URL (a path, a name). `unix:///path?password=…` is one though it has no host:
        # redis-py reads its query's password too.
        return value
    if parts.query:
        query = parse_qsl(parts.query, keep_blank_values=True)
        if any(_SECRET_NAME.search(name) for name, _ in query):
            hidden = [(name, MASK if _SECRET_NAME.search(name) else v) for name, v in query]
            parts = parts._replace(query=urlencode(hidden, safe="*"))
    # The query's secrets are masked first: a query password may hold an '@' itself, which the
    # rule below would take for the end of a userinfo, printing the password's tail as the host.
    scheme, _, rest = _joined(parts).partition("://")
    if "@" in rest and "@" not in parts.netloc and not rest.startswith("/"):
        # A '#', '/' or '?' in the userinfo (a password not percent-encoded) ends the authority
        # early, so the parser sees none, and the password was printed whole: everything up to the
        # last '@' is masked (a URL's other parts hold no '@' a setting needs to show). What follows
        # is read again, now with its true authority and query: a query password there is masked.
        return _mask_url(f"{scheme}://{MASK}@{rest.rpartition('@')[2]}")
    if "@" in parts.netloc:
        userinfo, _, host = parts.netloc.rpartition("@")
        user, colon, _ = userinfo.partition(":")
        if colon or user:
            masked = f"{user}:{MASK}@{host}" if colon else f"{MASK}@{host}"
            parts = parts._replace(netloc=masked)
    return _joined(parts)


def _joined(parts: SplitResult) -> str:
    """The URL again. urlunsplit drops the `//` of a URL with no host (`unix:///path` became
    `unix:/path`, which redis-py does not read as the socket), so such a one is joined here."""
    if parts.netloc:
        return urlunsplit(parts)
    query = f"?{parts.query}" if parts.query else ""
    fragment = f"#{parts.fragment}" if parts.fragment else ""
    return f"{parts.scheme}://{parts.path}{query}{fragment}"


def masked(name: str, value: Any) -> Any:
    if isinstance(value, dict):
        return {key: masked(key, inner) for key, inner in value.items()}
    if isinstance(value, str):
        if value and _SECRET_NAME.search(name):
            return MASK
        return _mask_url(value)
    if isinstance(value, list | tuple):
        # Each item under the list's name: a list of admin key hashes was printed whole.
        return [masked(name, inner) for inner in value]
    return value


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return _toml_string(str(value))


def _toml_string(text: str) -> str:
    """`text` as a TOML basic string: JSON's, but with characters past U+FFFF as themselves (JSON's
    surrogate pair escapes are no TOML: a model named with an emoji was settings that would not load
    again) and DEL escaped (JSON leaves it, TOML refuses it raw)."""
    return json.dumps(text, ensure_ascii=False).replace(chr(0x7F), "\\u007f")


_NOT_ASCII = re.compile(r"[^\x00-\x7f]")


def ascii_toml(document: str) -> str:
    """`document` (effective_toml's) in ASCII alone, for a stdout that can say nothing else (a C
    locale without Python's UTF-8 coercion), where a model named `modèle` was a UnicodeEncodeError
    traceback: every other character as TOML's escape of it. Each one is inside a basic string
    (_toml_string writes every value and every key that is not bare; the document has no
    comments), where the escape means the character itself: the settings load again the same."""
    return _NOT_ASCII.sub(_escaped, document)


def _escaped(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def _toml_key(key: str) -> str:
    """`key` as one TOML key: bare where TOML allows it, else quoted. Written bare, a model named
    `llama-3.1-8b` was the nested tables `llama-3` and `1-8b` ([models.llama-3.1-8b]), and a tier
    `pro plan` no TOML at all, in settings said to load again."""
    return key if _BARE_KEY.fullmatch(key) else _toml_string(key)


def _table(name: str, table: dict[str, Any], out: list[str]) -> None:
    # None is an unset optional setting (TOML has no null): left out, it keeps its meaning.
    scalars = {k: v for k, v in table.items() if not isinstance(v, dict) and v is not None}
    if scalars or not table:
        out.append(f"[{name}]")
        out.extend(f"{key} = {_toml_value(value)}" for key, value in scalars.items())
        out.append("")
    for key, value in table.items():
        if isinstance(value, dict):
            _table(f"{name}.{_toml_key(key)}", value, out)


def effective_toml(settings: Settings) -> str:
    """The settings as one TOML document (loadable again, secrets aside), secrets masked."""
    data = masked("", msgspec.to_builtins(settings))
    if data.get("models"):
        # Beside [models.*] the one-model table is read by nothing: shown, it read as a model served
        # (its source, name and token_weight) beside the ones that are.
        del data["model"]
    out: list[str] = []
    for name, table in data.items():
        _table(name, table, out)
    return "\n".join(out)
