"""`floodgate chat "prompt"`: stream a reply to the terminal; Ctrl-C stops it on the server.

The first Ctrl-C cancels through the API and the reply ends with the server's confirmation
("[stopped]", or a finished event with "cancelled": true in --json mode); a second one quits at once.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import asdict
from typing import BinaryIO, TextIO

import httpx

from floodgate_client.client import Client
from floodgate_client.errors import FloodgateError, NetworkError, RateLimitError
from floodgate_client.events import Finished, RequestStarted, StreamEvent, TextDelta
from floodgate_client.interrupt import CancelOnInterrupt
from floodgate_client.request import finite

DEFAULT_BASE_URL = "http://127.0.0.1:8000"
KEY_ENV = "FLOODGATE_API_KEY"
EXIT_INTERRUPTED = 130
# As a shell reports a process its reader left (128 + SIGPIPE).
EXIT_READER_GONE = 141


def add_chat_command(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `chat` on an argparse sub-command set (`parser.add_subparsers()`)."""
    chat = subparsers.add_parser("chat", help="stream a chat reply from a Floodgate edge")
    chat.add_argument(
        "prompt",
        nargs="?",
        help="the user message; '-', or none with a pipe or file as standard input, reads it from there",
    )
    chat.add_argument("--system", help="a system message to send first")
    chat.add_argument("--model", help="model name (default: your key's default model)")
    chat.add_argument("--max-tokens", type=int, help="most tokens to generate")
    chat.add_argument("--temperature", type=_finite_float)
    chat.add_argument("--seed", type=int)
    chat.add_argument("--base-url", default=DEFAULT_BASE_URL, help=f"the edge (default {DEFAULT_BASE_URL})")
    chat.add_argument("--json", action="store_true", help="print each event as a JSON line")
    chat.add_argument("--retry", action="store_true", help="wait as advised and retry (429, 503, 502...)")
    chat.set_defaults(handler=run_chat)


def _finite_float(text: str) -> float:
    """A number the request's JSON can carry: float() takes "nan", "inf" and "1e999", and the send
    raised a ValueError traceback naming no option."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    try:
        return finite("value", value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a finite number, not {text!r}") from None


def event_json(event: StreamEvent, ensure_ascii: bool = False) -> str:
    kind = {RequestStarted: "request_started", TextDelta: "text_delta", Finished: "finished"}[type(event)]
    return json.dumps({"type": kind, **asdict(event)}, ensure_ascii=ensure_ascii)


def run_chat(
    args: argparse.Namespace,
    out: TextIO = sys.stdout,
    err: TextIO = sys.stderr,
    stdin: BinaryIO | None = None,
) -> int:
    api_key = os.environ.get(KEY_ENV)
    if not api_key:
        print(f"error: set {KEY_ENV} to your API key", file=err)
        return 2
    if args.prompt is None or args.prompt == "-":
        try:
            prompt = _prompt_from(stdin, asked=args.prompt == "-")
        except KeyboardInterrupt:
            return EXIT_INTERRUPTED
        except ValueError as error:
            print(f"error: {error}", file=err)
            return 2
        args.prompt = prompt
    with _waits_told(err, args.retry):
        return _chat(args, api_key, out, err)


def _prompt_from(stdin: BinaryIO | None, *, asked: bool) -> str:
    """The prompt piped in (`git diff | floodgate chat`, `floodgate chat - < notes.txt`), as chat
    CLIs take it: `echo hi | floodgate chat` was a usage error. Read as UTF-8 bytes whatever the
    locale; the line end a file or `echo` leaves is not part of it. With no prompt given and a
    terminal as standard input, nothing is read: a command waiting in silence for typing it never
    asked for looked hung."""
    if stdin is None:
        stdin = sys.stdin.buffer if sys.stdin is not None else None
    if stdin is None or (not asked and stdin.isatty()):
        raise ValueError("give the prompt as an argument, or pipe it in (floodgate chat - < prompt.txt)")
    try:
        text = stdin.read().decode("utf-8").rstrip("\r\n")
    except UnicodeDecodeError:
        raise ValueError("the prompt is not valid UTF-8") from None
    if not text:
        raise ValueError("the prompt from standard input is empty")
    return text


def _chat(args: argparse.Namespace, api_key: str, out: TextIO, err: TextIO) -> int:
    for option in ("prompt", "system", "model"):
        text = getattr(args, option)
        if text is None:
            continue
        typed = _as_typed(text)
        if typed is None:
            # A byte that is not UTF-8 (`"$(cat notes.txt)"` of a Latin-1 file) reaches here as a
            # lone surrogate: httpx's JSON encoding raised UnicodeEncodeError, a traceback. The
            # model's name travels in the same JSON body.
            print(f"error: the {option} is not valid UTF-8", file=err)
            return 2
        setattr(args, option, typed)
    messages = [{"role": "system", "content": args.system}] if args.system else []
    messages.append({"role": "user", "content": args.prompt})
    base_url = _as_typed(args.base_url)  # an IDNA host, typed under a C locale
    if base_url is None:
        # httpx's encoding of the lone surrogate raises UnicodeEncodeError, a ValueError, which the
        # constructor's handler below said as the API key's fault.
        print("error: --base-url: not valid UTF-8", file=err)
        return 2
    try:
        client = Client(base_url, api_key)
    except ValueError as error:
        # Its message never quotes the key.
        print(f"error: {KEY_ENV}: {error}", file=err)
        return 2
    except httpx.InvalidURL as error:
        # A mistyped port or address ("Invalid port: '80OO'"): a traceback before.
        print(f"error: --base-url: {error}", file=err)
        return 2
    with client:
        try:
            stream = client.chat.stream(
                messages,
                model=args.model,
                max_tokens=args.max_tokens,
                temperature=args.temperature,
                seed=args.seed,
                auto_retry=args.retry,
            )
        except KeyboardInterrupt:
            return EXIT_INTERRUPTED
        except RateLimitError as error:
            wait = "" if error.retry_after_s is None else f"; retry in {error.retry_after_s:.1f} s"
            print(f"error: rate limited ({error.limit}){wait}", file=err)
            return 1
        except NetworkError as error:
            # Named: "Connection refused" alone left the reader to guess which edge (the default
            # 127.0.0.1:8000 where --base-url was forgotten, or a mistyped one).
            _write(err, f"error: {base_url}: {error.message}\n")
            return 1
        except FloodgateError as error:
            _write(err, f"error: {error.message}\n")
            return 1

        def cancel_running() -> object:
            if stream.retrying:
                # Refused and waiting to be sent again: the retry is called off (its refused request
                # ended on the server, where a cancel of it answered 409 and the retry went on).
                return stream.cancel()
            # Read when Ctrl-C comes: a stream refused before its first text is reopened under a new id.
            request_id = stream.request_id
            if request_id is None:
                raise NetworkError("no request id yet to cancel")
            return client.chat.cancel(request_id)

        # Asked once: each isatty() is a system call, and a reply is hundreds of deltas.
        terminal = _is_terminal(out)
        with ExitStack() as exits:
            exits.enter_context(stream)
            interrupt = exits.enter_context(CancelOnInterrupt(cancel_running, err))
            try:
                for event in stream:
                    _print_event(event, args.json, out, err, terminal)
            except KeyboardInterrupt:
                # The second Ctrl-C: quit now. The stream's exit would send a cancel of its own and
                # wait up to CANCEL_ON_EXIT_S for it, silent, where the first cancel was unanswered
                # (5.2 s against a stopped edge). The dropped connection is the edge's cancel.
                exits.pop_all()
                interrupt.__exit__(None, None, None)
                stream.close()
                return EXIT_INTERRUPTED
            except BrokenPipeError:
                # Piped into `head` and the like: the reader has what it wanted. The stream's exit
                # stops the generation; no traceback, and nothing more written to the closed pipe.
                _quiet(out)
                return EXIT_READER_GONE
            except FloodgateError as error:
                _write(err, f"\nerror: {error.message}\n")
                return 1
    return EXIT_INTERRUPTED if interrupt.interrupted else 0


def _as_typed(argument: str) -> str | None:
    """An argument as the terminal sent it, UTF-8 (None where its bytes are not). Under a locale
    that is not UTF-8 (C, without Python's UTF-8 coercion) Python decoded it as ASCII and handed
    "caf\u00e9" on as lone surrogates: a prompt that was UTF-8 was refused as not."""
    if _utf_8(argument):
        return argument
    try:
        return os.fsencode(argument).decode("utf-8")
    except UnicodeError:
        return None


def _utf_8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


@contextmanager
def _waits_told(err: TextIO, retrying: bool) -> Iterator[None]:
    """With --retry, the client's retries and waits (logged at INFO) on `err` while the chat runs:
    it printed nothing for as long as it waited out a 429's Retry-After (19.6 s in a review)."""
    if not retrying:
        yield
        return
    logger = logging.getLogger("floodgate.client")
    handler = logging.StreamHandler(err)
    handler.setFormatter(logging.Formatter("floodgate: %(message)s"))
    handler.setLevel(logging.INFO)
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def _quiet(out: TextIO) -> None:
    """Point `out` at /dev/null, so that the interpreter's own flush at exit finds no closed pipe."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, out.fileno())
    except (OSError, ValueError):
        pass  # not a real file (a test's buffer): nothing flushes it at exit


def _write(stream: TextIO, text: str) -> None:
    """`text`, with what the stream's encoding cannot say as "?": a Windows console or pipe
    (cp1252), a locale or PYTHONIOENCODING that is not UTF-8. The reply's first emoji raised
    UnicodeEncodeError there, a traceback in the middle of it. A text stream encodes the whole
    string before it writes any of it, so nothing is written twice."""
    try:
        stream.write(text)
    except UnicodeEncodeError:
        encoding = stream.encoding or "utf-8"
        stream.write(text.encode(encoding, errors="replace").decode(encoding))


# A reply's control characters as `cat -v` shows them (^[ for ESC), on a terminal: the model's text,
# which a prompt can steer, otherwise reached the terminal as commands (an ESC sequence can set the
# window's title, move the cursor over what was printed, or write the clipboard: OSC 52). Line feeds
# and tabs pass; piped, the reply is written as it came.
_VISIBLE_CONTROLS = {
    **{code: "^" + chr(code + 0x40) for code in range(0x20) if chr(code) not in "\n\t"},
    0x7F: "^?",
    **{code: "M-^" + chr(code - 0x80 + 0x40) for code in range(0x80, 0xA0)},
}


def _is_terminal(out: TextIO) -> bool:
    try:
        return out.isatty()
    except (AttributeError, ValueError):
        return False  # a test's buffer, or a closed stream


def _print_event(event: StreamEvent, as_json: bool, out: TextIO, err: TextIO, terminal: bool = False) -> None:
    if as_json:
        try:
            out.write(event_json(event) + "\n")
        except UnicodeEncodeError:
            # JSON says any character in ASCII: the reader still gets the reply as it was sent.
            out.write(event_json(event, ensure_ascii=True) + "\n")
        out.flush()
    elif isinstance(event, TextDelta):
        _write(out, event.text.translate(_VISIBLE_CONTROLS) if terminal else event.text)
        out.flush()
    elif isinstance(event, Finished):
        out.write("\n")
        note = "stopped" if event.cancelled else event.reason
        if event.limit_reached:
            note += f", {event.limit_reached} limit reached"
        if event.usage is not None:
            note += f", {event.usage.prompt_tokens} in / {event.usage.completion_tokens} out"
        print(f"[{note}]", file=err)


def main(argv: Sequence[str] | None = None) -> int:
    # Its own name: an install of the client alone has no `floodgate` command, which its usage
    # and errors named (`floodgate chat` is this command's twin in the server's distribution).
    parser = argparse.ArgumentParser(prog="floodgate-client", description="Floodgate client")
    add_chat_command(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return int(args.handler(args))
