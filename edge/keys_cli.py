"""`floodgate keys …` and `floodgate usage`: the operator's key lifecycle and usage report, run
against the shared store the settings name (the same one the edges read)."""

from __future__ import annotations

import argparse
import asyncio
import csv
import io
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from edge.aws_client import aws_client
from edge.config import Settings
from edge.keys.cli_support import (
    drop_stdout,
    note,
    opened_lifecycle,
    opened_usage,
    run,
    say,
    typed_text,
    write_data,
)
from edge.keys.legacy import BadKeysFile, parse_jsonl
from edge.keys.lifecycle import InvalidPeriod, KeyLifecycle, KeyNotFound, Rotated, checked_period
from edge.keys.page import KEY_ID, MAX_LIMIT
from edge.keys.record import (
    ADMIN_KEY_PREFIX,
    InvalidLabel,
    InvalidUser,
    KeyRecord,
    UnknownTier,
    hash_key,
    new_secret,
    printable,
)
from edge.keys.store import KeyIdTaken
from edge.keys.views import key_view
from edge.operator_cli import add_config_option, settings_of
from edge.sqlite_file import unopenable
from edge.usage.day import checked_day

# The keys `keys list` reads a round trip: the admin API's largest page.
PAGE_SIZE = MAX_LIMIT
_LIST_COLUMNS = ("id", "user", "tier", "label", "last4", "status", "created", "expires", "replaced_by")
_USAGE_COLUMNS = ("user", "model", "date", "input_tokens", "input_cached_tokens", "output_tokens", "requests")


def _store_settings(args: argparse.Namespace, *, creates: bool = False) -> tuple[Settings, bool]:
    """The settings, once the key store's SQLite file, where it is one, opens, and whether the
    command may make a missing store. It may only where it `creates` keys, or to take in the old
    keys file's: any other command made an empty store at a mistyped path (or table, at a local
    DynamoDB endpoint) and answered from it ("no keys", "no key key_…"), as if the operator's keys
    were gone, and left that stray file (table) behind. A missing table is said by `run`."""
    settings = settings_of(args)
    keys_file = settings.server.keys_file
    makes = creates or bool(keys_file and os.path.isfile(keys_file))
    if settings.keys.backend == "sqlite":
        path = settings.keys.sqlite_path
        if not (makes or os.path.exists(path)):
            raise SystemExit(
                f"floodgate: keys.sqlite_path {path!r}: no key store there (no such file); "
                "`floodgate keys create` or `floodgate serve` makes one"
            )
        problem = unopenable({"keys.sqlite_path": path})
        if problem:
            raise SystemExit(f"floodgate: {problem}")
    return settings, makes


class _Unshown(Exception):
    """The secret `show` was to print could not be written: what was done about it, said."""


def _lifecycle_command(
    args: argparse.Namespace,
    step: Any,
    *,
    creates: bool = False,
    show: Callable[[Any], None] | None = None,
    unshown: Callable[[KeyLifecycle, Any, OSError], Awaitable[str]] | None = None,
) -> Any:
    """`step`'s result; `show`, given one, says it before the store closes (a secret it holds).
    `unshown`: where standard output takes no more (a full disk under `> key.txt`, a pipe's reader
    gone), what undoes the result, or says how to; its answer is the error said."""
    settings, makes = _store_settings(args, creates=creates)

    async def go() -> Any:
        shown = False
        try:
            async with opened_lifecycle(settings, creates=makes) as keys:
                result = await step(keys)
                if show is not None:
                    # Before the store's (and Redis's) close: a Ctrl-C while it closed lost the
                    # result, and with it a key made, live and shown to nobody. No await comes
                    # between: a Ctrl-C now (asyncio.run cancels the command) lands at the close.
                    try:
                        show(result)
                    except OSError as exc:
                        if unshown is None:
                            raise
                        raise _Unshown(await unshown(keys, result, exc)) from None
                    shown = True
        except asyncio.CancelledError:
            if not shown:
                raise
            # The command's work is done and said: a close cut short is no failure, and a 130
            # would tell a script to throw away the key it was shown (a rotation that lands under
            # Ctrl-C exits 0 and prints its key too).
        return result

    try:
        return run(go, settings.keys)
    except _Unshown as exc:
        drop_stdout()
        raise SystemExit(f"floodgate: {exc}") from None
    except (KeyNotFound, UnknownTier, InvalidUser, InvalidLabel, InvalidPeriod, KeyIdTaken) as exc:
        raise SystemExit(f"floodgate: {exc}") from None
    except BadKeysFile as exc:
        # From `[server] keys_file`, which every key command imports first: named, since the
        # command itself named no file.
        raise SystemExit(f"floodgate: {settings.server.keys_file}: {exc}") from None


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive whole number, not {text!r}")
    return value


def _key_id(text: str) -> str:
    if not KEY_ID.fullmatch(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a key id (key_ and its hex digits)")
    return text


def _when(ts: float | None) -> str:
    """A time for the table. One the platform cannot convert (a store written before expiries were
    capped may hold 1e300) is shown as its Unix seconds: one such key made the whole listing fail."""
    if ts is None:
        return "-"
    try:
        return time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(ts))
    except (OverflowError, OSError, ValueError):
        return f"{ts:g} (Unix s)"


def _print_table(rows: list[dict[str, Any]], columns: tuple[str, ...]) -> None:
    # Escaped: a user or label a store holds from before control characters were refused
    # (checked_user, checked_label) drew rows of its own and sent escape sequences to the terminal.
    cells = [[printable(str(row[c])) for c in columns] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    for line in [list(columns), *cells]:
        say("  ".join(v.ljust(w) for v, w in zip(line, widths, strict=True)).rstrip())


_MAX_DAYS = 36525


def _create(args: argparse.Namespace) -> int:
    days = args.expires_in_days
    if days is not None and not 0 < days <= _MAX_DAYS:
        # Said in the unit given: the lifecycle's own refusal speaks the admin API's seconds.
        raise SystemExit(
            f"floodgate: --expires-in-days must be a positive number of days, at most {_MAX_DAYS} "
            f"(100 years), not {days:g}"
        )
    expires_in = None if days is None else days * 86400

    async def step(keys: KeyLifecycle) -> Any:
        try:
            return await keys.create(args.user, args.tier, args.label, expires_in)
        except asyncio.CancelledError:
            # Ctrl-C (asyncio.run cancels the command): create revokes a key it stored and had not
            # handed back, so a retry leaves no second credential behind.
            note("floodgate: no working key was created (one stored before the interrupt is revoked)")
            raise

    def show(created: tuple[str, KeyRecord]) -> None:
        key, record = created
        made = f"created {record.id} for user {record.user!r} (tier {record.tier!r})"
        note(f"{made}; the key is shown only once:")
        print(key, flush=True)

    async def unshown(keys: KeyLifecycle, created: tuple[str, KeyRecord], exc: OSError) -> str:
        # Left stored, it was a working credential that nobody had: a script's `> key.txt` on a
        # full disk said a traceback, and the key a retry made was a second one.
        record = await keys.revoke(created[1].id)
        return (
            f"cannot write the key to standard output ({exc.strerror or exc}): {record.id} is revoked, "
            "so no key was left working; nothing else changed"
        )

    _lifecycle_command(args, step, creates=True, show=show, unshown=unshown)
    return 0


def _refuse_empty_user(user: str | None) -> None:
    """No key has an empty user (keys create refuses one), so nothing is ever listed for it; and on
    DynamoDB the key listing's index query for it is refused."""
    if user is not None and not user.strip():
        raise SystemExit("floodgate: --user must not be empty")


def _list(args: argparse.Namespace) -> int:
    _refuse_empty_user(args.user)

    async def step(keys: KeyLifecycle) -> tuple[list[KeyRecord], bool]:
        # A page at a time, as the admin API reads them: all of a big table at once was one
        # unbounded read (on DynamoDB, a Scan of every key and usage row).
        found: list[KeyRecord] = []
        after, more = args.after, True
        while more and (args.limit is None or len(found) < args.limit):
            want = PAGE_SIZE if args.limit is None else min(PAGE_SIZE, args.limit - len(found))
            page = await keys.page_keys(args.user, after, want)
            found += page.keys
            more = page.has_more
            after = page.keys[-1].id if page.keys else after
        return found, more

    records, more = _lifecycle_command(args, step)
    if more:
        note(f"more keys follow: list them with --after {records[-1].id}")
    views = [key_view(r) for r in records]
    if args.json:
        print(json.dumps(views, indent=2))
        return 0
    for v in views:
        v["created"], v["expires"] = _when(v["created"]), _when(v["expires"])
        v["last4"] = f"…{v['last4']}" if v["last4"] else "-"
        v["replaced_by"] = v["replaced_by"] or "-"
    _print_table(views, _LIST_COLUMNS)
    return 0


def _revoke(args: argparse.Namespace) -> int:
    async def step(keys: KeyLifecycle) -> Any:
        return await keys.revoke_line(args.key_id)

    revoked = _lifecycle_command(args, step)
    record = revoked.key
    note(f"revoked {record.id} (user {record.user!r})")
    for older in revoked.replaced:
        # Said: a key still in use (a deployment not yet moved to its replacement) stopped too.
        note(f"also revoked {older.id}, which it replaced (its rotation's grace ended now)")
    return 0


def _rotate(args: argparse.Namespace) -> int:
    if args.grace_s is not None:
        try:
            # Named as typed: the lifecycle's own refusal names the admin API's grace_s.
            checked_period("--grace-s", args.grace_s, zero_ok=True)
        except InvalidPeriod as exc:
            raise SystemExit(f"floodgate: {exc}") from None

    async def step(keys: KeyLifecycle) -> Any:
        try:
            return await keys.rotate(args.key_id, args.grace_s)
        except asyncio.CancelledError:
            # Ctrl-C (asyncio.run cancels the command): rotate hands back a rotation that landed,
            # to be shown, and revokes a new key that had not replaced the old one yet.
            note(
                f"floodgate: {args.key_id} was not rotated: it is as it was, and no new key was left working"
            )
            raise

    def show(rotated: Rotated) -> None:
        old, until = rotated.old.id, _when(rotated.old.expires)
        note(
            f"{rotated.new.id} replaces {old}, which keeps working until {until}. "
            "The new key is shown only once:"
        )
        print(rotated.key, flush=True)

    async def unshown(keys: KeyLifecycle, rotated: Rotated, exc: OSError) -> str:
        # The rotation stands (no store takes a replacement back); revoking its new key would end
        # the old one's grace too (revoke_line). A rotation of the new key, with no grace, makes
        # one that can be read and ends the unread one at once.
        until = _when(rotated.old.expires)
        return (
            f"cannot write the new key to standard output ({exc.strerror or exc}): {rotated.new.id} "
            f"replaces {rotated.old.id} all the same, which keeps working until {until}; "
            f"`floodgate keys rotate {rotated.new.id} --grace-s 0` ends the unread key and prints another"
        )

    _lifecycle_command(args, step, show=show, unshown=unshown)
    return 0


def _set_tier(args: argparse.Namespace) -> int:
    async def step(keys: KeyLifecycle) -> Any:
        return await keys.set_tier(args.key_id, args.tier)

    record = _lifecycle_command(args, step)
    note(f"{record.id} (user {record.user!r}) is now on tier {record.tier!r}")
    return 0


def _read_secret(secret_id: str) -> str:
    """The secret's text; an unknown secret, no credentials or no region is said, not a traceback."""
    try:
        value: str = aws_client("secretsmanager").get_secret_value(SecretId=secret_id)["SecretString"]
    except (BotoCoreError, ClientError) as exc:
        raise SystemExit(f"floodgate: cannot read the secret {secret_id!r}: {exc}") from None
    return value


def _import(args: argparse.Namespace) -> int:
    if args.file is None and not args.secret_id and sys.stdin.isatty():
        # Standard input, the default, at a terminal: the command sat waiting for keys typed in,
        # without a word, as if hung. A usage error (2), as `usage`'s swapped days are; `-` names
        # the terminal on purpose.
        print(
            "floodgate keys import: error: no file given, and standard input is a terminal: "
            "name the keys.jsonl, or - to type its lines in (Ctrl-D to end)",
            file=sys.stderr,
        )
        return 2
    if args.secret_id:
        text = _read_secret(args.secret_id)
    elif args.file in (None, "-"):
        try:
            # Read as bytes: the text stream's decoding (strict, or surrogateescape under the C
            # locale) let a binary file through to a Unicode error traceback.
            text = sys.stdin.buffer.read().decode("utf-8")
        except UnicodeDecodeError as exc:
            raise SystemExit(f"floodgate: cannot read standard input: {exc}") from None
    else:
        try:
            with open(args.file, encoding="utf-8") as source:
                text = source.read()
        except (OSError, UnicodeDecodeError) as exc:
            # A missing or unreadable file, a directory, a binary one: a traceback before.
            raise SystemExit(f"floodgate: cannot read {args.file}: {exc}") from None
    try:
        keys_found = parse_jsonl(text.splitlines(), settings_of(args).tiers)
    except BadKeysFile as exc:
        raise SystemExit(f"floodgate: not a keys file: {exc}") from None

    async def step(keys: KeyLifecycle) -> Any:
        return await keys.import_keys(keys_found)

    done = _lifecycle_command(args, step, creates=True)
    note(f"imported {done.added} keys; {done.present} were already in the store (left as they are)")
    return 0


def _admin_key(args: argparse.Namespace) -> int:
    key = new_secret(ADMIN_KEY_PREFIX)
    # The key first, its hash only once it is written: `> admin.txt` on a full disk printed the
    # setting, then a traceback, and the hash an operator put in the settings was of a key nobody had.
    try:
        print(key, flush=True)
    except OSError as exc:
        raise SystemExit(
            f"floodgate: cannot write the admin key to standard output ({exc.strerror or exc}): "
            "no admin key was made; nothing changed"
        ) from None
    note("A new admin key (above, shown only once). Put its hash in the edge's settings:")
    note(f'  [keys]\n  admin_key_sha256 = "{hash_key(key)}"')
    # Replacing the old hash at once would refuse every tool still on the old key.
    note("Rotating: list it beside the old hash, admin_key_sha256 = [old, new], until every tool has it.")
    return 0


def _day(value: str) -> str:
    try:
        return checked_day(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _usage(args: argparse.Namespace) -> int:
    _refuse_empty_user(args.user)
    if args.start and args.end and args.start > args.end:
        # Swapped, they printed an empty table, which reads as no usage at all. A usage error (2),
        # as a day that does not exist is.
        print(f"floodgate usage: error: --start {args.start} is after --end {args.end}", file=sys.stderr)
        return 2
    settings, makes = _store_settings(args)

    async def go() -> Any:
        async with opened_usage(settings, creates=makes) as store:
            return await store.query(args.user, args.start or "", args.end or "")

    rows = [row.as_dict() for row in run(go, settings.keys)]
    if args.csv:
        document = io.StringIO()
        out = csv.DictWriter(document, fieldnames=_USAGE_COLUMNS, lineterminator="\n")
        out.writeheader()
        out.writerows(rows)
        write_data(document.getvalue())
    else:
        _print_table(rows, _USAGE_COLUMNS)
    return 0


def add_keys_commands(commands: Any) -> None:
    """`commands`: the `floodgate` parser's subparsers."""
    keys = commands.add_parser("keys", help="manage API keys (in the shared key store)").add_subparsers(
        dest="keys_command", required=True
    )

    def sub(name: str, help: str, handler: Any) -> argparse.ArgumentParser:
        parser: argparse.ArgumentParser = keys.add_parser(name, help=help)
        add_config_option(parser)
        parser.set_defaults(handler=handler)
        return parser

    create = sub("create", "create a key and print it (the only time it is shown)", _create)
    create.add_argument("--user", required=True, type=typed_text)
    create.add_argument("--tier", required=True, type=typed_text)
    create.add_argument(
        "--label",
        default="",
        type=typed_text,
        help="a note for the operator, e.g. the customer's app (at most 1024 bytes)",
    )
    create.add_argument(
        "--expires-in-days", type=float, help="at most 36525 (100 years); default: never expires"
    )

    listing = sub("list", "list keys (id, user, label, last four characters; never the key)", _list)
    listing.add_argument("--user", type=typed_text, help="only this user's keys")
    listing.add_argument("--limit", type=_positive, help="at most this many keys (default: every one)")
    listing.add_argument(
        "--after", type=_key_id, help="the keys whose ids follow this one (keys are listed by id)"
    )
    listing.add_argument("--json", action="store_true", help="JSON instead of a table")

    sub("revoke", "revoke a key: refused by every edge within keys.cache_ttl_s", _revoke).add_argument(
        "key_id"
    )

    rotate = sub(
        "rotate",
        "a new key for the same user and tier; the old one works for a grace period."
        " Once per key: a second rotate is refused and names the first one's new key",
        _rotate,
    )
    rotate.add_argument("key_id")
    rotate.add_argument("--grace-s", type=float, help="default: keys.rotation_grace_s")

    set_tier = sub("set-tier", "move a key to another tier", _set_tier)
    set_tier.add_argument("key_id")
    set_tier.add_argument("tier", type=typed_text)

    importing = sub(
        "import", "import a keys.jsonl (hashes, as `keys create` used to write) into the store", _import
    )
    importing.add_argument(
        "file", nargs="?", help="the JSONL file, or - for stdin (the default, unless it is a terminal)"
    )
    importing.add_argument("--secret-id", help="read it from this Secrets Manager secret instead")

    admin = keys.add_parser("admin-key", help="make an admin key for /v1/admin/* and print its hash setting")
    admin.set_defaults(handler=_admin_key)

    usage = commands.add_parser("usage", help="tokens used per user, model and UTC day")
    add_config_option(usage)
    usage.add_argument("--user", type=typed_text, help="only this user (default: everyone)")
    usage.add_argument("--start", type=_day, help="first day, YYYY-MM-DD (UTC)")
    usage.add_argument("--end", type=_day, help="last day, YYYY-MM-DD (UTC)")
    usage.add_argument("--csv", action="store_true", help="CSV instead of a table")
    usage.set_defaults(handler=_usage)
