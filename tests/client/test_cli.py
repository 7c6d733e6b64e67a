"""`python -m floodgate_client chat`: streams JSON lines, and Ctrl-C (SIGINT) cancels on the server."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from edge.sse import DONE, ChunkEncoder
from floodgate_client import Client
from floodgate_client.cli import add_chat_command, run_chat
from tests.client.live import LONG_REPLY, LONG_REPLY_TOKENS
from tests.client.scripted_edge import ScriptedEdge
from tests.support.ascii_locale import ASCII_LOCALE
from tests.support.flaky_proxy import flaky_proxy
from tests.support.live_server import LiveServer
from tests.support.ports import free_port

REPO = Path(__file__).resolve().parents[2]


def checkout_env() -> dict[str, str]:
    """The environment for a CLI subprocess, importing this checkout's client (client/) as the tests
    do (pyproject's pythonpath, which reaches no subprocess): without it the command ran whichever
    checkout the venv's editable install points at."""
    paths = [str(REPO / "client"), str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}


def chat_cli(
    edge: LiveServer | ScriptedEdge,
    *args: str,
    key: str | None,
    base_url: str | None = None,
    stdin: int | None = None,
) -> subprocess.Popen[str]:
    """`floodgate-client chat ARGS` against `edge` (or `base_url`), with `key` as its API key (none:
    unset), this checkout's client imported (checkout_env), stdout and stderr piped."""
    env = {k: v for k, v in checkout_env().items() if k != "FLOODGATE_API_KEY"}
    if key is not None:
        env["FLOODGATE_API_KEY"] = key
    return subprocess.Popen(
        [sys.executable, "-m", "floodgate_client", "chat", *args, "--base-url", base_url or edge.base_url],
        cwd=REPO,
        env=env,
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.parametrize("argv", [[], ["-"]], ids=["piped", "dash"])
def test_a_prompt_piped_in_is_the_prompt(server: LiveServer, argv: list[str]) -> None:
    """`echo ... | floodgate chat` was a usage error ("the following arguments are required"). The
    piped text, its line end left off, is the prompt: the same greedy reply as given as an argument."""
    options = ["--temperature", "0", "--max-tokens", "8"]
    given = chat_cli(server, LONG_REPLY.prompt, *options, key=server.keys["paid"])
    piped = chat_cli(server, *argv, *options, key=server.keys["paid"], stdin=subprocess.PIPE)
    given_out, given_err = given.communicate(timeout=60)
    piped_out, piped_err = piped.communicate(LONG_REPLY.prompt + "\n", timeout=60)
    assert given.returncode == piped.returncode == 0, (given_err, piped_err)
    assert piped_out.strip() and piped_out == given_out


def test_no_prompt_and_a_terminal_is_a_usage_error_not_a_silent_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    primary, secondary = os.openpty()
    try:
        with open(secondary, "rb", buffering=0, closefd=False) as terminal:
            out, err = io.StringIO(), io.StringIO()
            monkeypatch.setenv("FLOODGATE_API_KEY", "fg-secret-key")
            parser = argparse.ArgumentParser()
            add_chat_command(parser.add_subparsers())
            args = parser.parse_args(["chat", "--base-url", "http://127.0.0.1:9"])
            assert run_chat(args, out, err, stdin=terminal) == 2  # returns: nothing was read
    finally:
        os.close(primary)
        os.close(secondary)
    assert err.getvalue().startswith("error: give the prompt as an argument, or pipe it in"), err.getvalue()


@pytest.mark.parametrize(("piped", "said"), [(b"caf\xe9\n", "not valid UTF-8"), (b"\n", "is empty")])
def test_a_piped_prompt_that_cannot_be_sent_is_said(piped: bytes, said: str, tmp_path: Path) -> None:
    prompt = tmp_path / "prompt.txt"
    prompt.write_bytes(piped)
    env = {**checkout_env(), "FLOODGATE_API_KEY": "fg-secret-key"}
    with prompt.open("rb") as stdin:  # `floodgate chat - < prompt.txt`; no edge listens on port 9
        done = subprocess.run(
            [sys.executable, "-m", "floodgate_client", "chat", "-", "--base-url", "http://127.0.0.1:9"],
            cwd=REPO,
            env=env,
            stdin=stdin,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 2 and said in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_json_mode_prints_every_event_as_a_json_line(server: LiveServer) -> None:
    proc = chat_cli(
        server,
        LONG_REPLY.prompt,
        "--json",
        "--temperature",
        "0",
        "--max-tokens",
        "8",
        key=server.keys["paid"],
    )
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    events: list[dict[str, Any]] = [json.loads(line) for line in out.splitlines()]
    assert events[0]["type"] == "request_started" and events[0]["request_id"].startswith("chatcmpl-")
    assert any(event["type"] == "text_delta" for event in events)
    assert events[-1]["type"] == "finished" and events[-1]["usage"]["completion_tokens"] <= 8


def test_plain_mode_prints_the_reply_text(server: LiveServer) -> None:
    proc = chat_cli(
        server, LONG_REPLY.prompt, "--temperature", "0", "--max-tokens", "8", key=server.keys["paid"]
    )
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert out.strip() and "[" in err


def _interrupted_long_reply(
    server: LiveServer, *args: str, base_url: str | None = None
) -> tuple[list[str], int, dict[str, Any], str]:
    """A long reply in --json mode, SIGINT once its first text has arrived: the request ids it
    started, its exit code, its last event and its stderr."""
    proc = chat_cli(
        server,
        LONG_REPLY.prompt,
        "--json",
        "--temperature",
        str(LONG_REPLY.temperature),
        "--max-tokens",
        str(LONG_REPLY_TOKENS),
        *args,
        key=server.keys["paid"],
        base_url=base_url,
    )
    assert proc.stdout is not None
    started = []
    for line in proc.stdout:
        event = json.loads(line)
        if event["type"] == "request_started":
            started.append(event["request_id"])
        if event["type"] == "text_delta":
            break
    proc.send_signal(signal.SIGINT)
    rest, err = proc.communicate(timeout=60)
    return started, proc.returncode, json.loads(rest.splitlines()[-1]), err


def test_ctrl_c_cancels_the_generation_on_the_server(server: LiveServer) -> None:
    _, returncode, finished, err = _interrupted_long_reply(server)
    assert returncode == 130, err
    # The reply ends with the server's own final chunk saying it was cancelled.
    assert finished["type"] == "finished" and finished["cancelled"] is True
    assert finished["usage"]["completion_tokens"] < LONG_REPLY_TOKENS


def test_a_stream_cut_after_its_first_event_ends_with_an_error_not_a_second_request(
    server: LiveServer,
) -> None:
    """Once the stream has opened, a cut is not a reason to send the request again: the edge may
    have charged the reply's first tokens, which may carry no text yet."""
    port = urlsplit(server.base_url).port
    assert port is not None
    with flaky_proxy(port, ["cut_after_start"]) as proxy:
        proc = chat_cli(server, LONG_REPLY.prompt, "--json", key=server.keys["paid"], base_url=proxy.base_url)
        out, err = proc.communicate(timeout=60)
    started = [line for line in out.splitlines() if json.loads(line)["type"] == "request_started"]
    assert proc.returncode == 1 and "stream broken" in err, err
    assert len(started) == 1 and proxy.connections == 1


def test_a_missing_key_is_reported_without_a_request(server: LiveServer) -> None:
    proc = chat_cli(server, "Hello", key=None)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "FLOODGATE_API_KEY" in err


def test_a_base_url_with_the_sdks_v1_reaches_the_edge(server: LiveServer) -> None:
    # The OpenAI SDK's convention (the README's example passes it): it reached /v1/v1/... ("Not Found").
    # Greedy on a prompt sure to get text: sampled, the random-weight model's first token may be its
    # end token, and the reply empty (a review's run).
    proc = chat_cli(
        server,
        LONG_REPLY.prompt,
        "--temperature",
        "0",
        "--max-tokens",
        "2",
        key=server.keys["paid"],
        base_url=server.base_url + "/v1/",
    )
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and out.strip(), err


def test_a_reader_that_goes_away_ends_the_chat_quietly(server: LiveServer) -> None:
    # Piped into `head`: a BrokenPipeError traceback and exit status 1 before.
    proc = chat_cli(
        server,
        LONG_REPLY.prompt,
        "--json",
        "--temperature",
        str(LONG_REPLY.temperature),
        "--max-tokens",
        str(LONG_REPLY_TOKENS),
        key=server.keys["paid"],
    )
    assert proc.stdout is not None and proc.stderr is not None
    first = json.loads(proc.stdout.readline())
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=60) == 141, err
    assert err == "", err  # no traceback, nor the client's own notes (its cancel on exit found it gone)
    assert first["type"] == "request_started"


def test_retry_says_on_stderr_what_it_waits_for(
    server: LiveServer, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # It printed nothing for as long as it waited (19.6 s in a review).
    monkeypatch.setenv("FLOODGATE_API_KEY", server.keys["free"])
    with Client(server.base_url, server.keys["free"]) as client:
        client.chat.create("fill the window", max_tokens=2, auto_retry=True, deadline_s=10)
    out, err = io.StringIO(), io.StringIO()
    args = argparse.Namespace(
        prompt="hi",
        system=None,
        model=None,
        max_tokens=2,
        temperature=None,
        seed=None,
        base_url=server.base_url,
        json=False,
        retry=True,
    )
    assert run_chat(args, out, err) == 0, err.getvalue()
    assert re.search(r"floodgate: HTTP 429 \(rate_limit_exceeded\): retrying in \d", err.getvalue()), (
        err.getvalue()
    )


def _chat_offline(
    monkeypatch: pytest.MonkeyPatch, argv: list[str], out: io.TextIOBase, err: io.TextIOBase
) -> int:
    """`floodgate chat ARGV` in process, with a key that must never be printed."""
    monkeypatch.setenv("FLOODGATE_API_KEY", "fg-secret-key")
    parser = argparse.ArgumentParser()
    add_chat_command(parser.add_subparsers())
    return run_chat(parser.parse_args(argv), out, err)


# A mistyped port, an IPv6 address left open, a host with an empty label (a doubled dot), which
# getaddrinfo refuses with a UnicodeError from its IDNA encoding rather than an OSError.
# And a byte the locale could not decode in its path (a lone surrogate): httpx's encoding of it
# raised a UnicodeEncodeError, a ValueError, said as if it were the API key's.
@pytest.mark.parametrize(
    "base_url",
    ["http://127.0.0.1:80OO", "http://[::1", "http://api..example.com", "http://127.0.0.1:8000/\udcff"],
)
def test_a_malformed_base_url_is_an_error_message_not_a_traceback(
    base_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A mistyped port or IPv6 address: httpx.InvalidURL escaped from the client's constructor.
    out, err = io.StringIO(), io.StringIO()
    assert _chat_offline(monkeypatch, ["chat", "hi", "--base-url", base_url], out, err) == 2
    assert err.getvalue().startswith("error: --base-url: "), err.getvalue()
    assert "fg-secret-key" not in err.getvalue() and not out.getvalue()


def test_an_edge_that_cannot_be_reached_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    """It said "error: request failed: [Errno 111] Connection refused", naming no address."""
    base_url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    out, err = io.StringIO(), io.StringIO()
    assert _chat_offline(monkeypatch, ["chat", "hi", "--base-url", base_url], out, err) == 1
    assert err.getvalue().startswith(f"error: {base_url}: "), err.getvalue()
    assert "refused" in err.getvalue().lower() and not out.getvalue()


@pytest.mark.parametrize("option", ["prompt", "system", "model"])
def test_a_prompt_not_in_utf_8_is_an_error_message_not_a_traceback(
    option: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `floodgate chat "$(cat notes.txt)"` with a Latin-1 file: Python hands the undecodable byte on
    # as a lone surrogate, and a UnicodeEncodeError escaped from httpx's JSON encoding.
    latin_1 = os.fsdecode(b"caf\xe9")
    argv = ["chat", latin_1] if option == "prompt" else ["chat", "hi", f"--{option}", latin_1]
    out, err = io.StringIO(), io.StringIO()
    # No edge listens on port 9: nothing is sent.
    assert _chat_offline(monkeypatch, [*argv, "--base-url", "http://127.0.0.1:9"], out, err) == 2
    assert err.getvalue() == f"error: the {option} is not valid UTF-8\n" and not out.getvalue()


def test_a_prompt_beyond_ascii_is_sent_as_typed_under_an_ascii_locale(server: LiveServer) -> None:
    """Under a C locale without Python's UTF-8 coercion, Python decodes the arguments as ASCII and
    hands a UTF-8 terminal's "caf\u00e9" on as lone surrogates: the CLI said "the prompt is not valid
    UTF-8" of a prompt that is, and sent nothing. It is sent as typed, the reply as the same prompt's."""
    prompt = "caf\u00e9 \U0001f600"
    key = server.keys["paid"]
    with Client(server.base_url, key) as client:
        expected = client.chat.create(prompt, max_tokens=6, temperature=0)
    env = {**checkout_env(), "FLOODGATE_API_KEY": key}
    env |= ASCII_LOCALE
    argv = ["-m", "floodgate_client", "chat", prompt, "--json", "--max-tokens", "6", "--temperature", "0"]
    done = subprocess.run(
        [sys.executable.encode(), *(word.encode() for word in argv), b"--base-url", server.base_url.encode()],
        cwd=REPO,
        env=env,
        capture_output=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    events = [json.loads(line) for line in done.stdout.decode("ascii").splitlines()]
    assert "".join(e["text"] for e in events if e["type"] == "text_delta") == expected.text
    assert expected.usage is not None and events[-1]["usage"]["prompt_tokens"] == expected.usage.prompt_tokens


@pytest.mark.parametrize("host", ["مثال1.example", "א1.example"])
def test_an_idna_2008_host_is_a_base_url_the_cli_takes(server: LiveServer, host: str) -> None:
    """An Arabic or Hebrew label ending in a digit is a valid IDNA 2008 name (httpx sends it as
    punycode, xn--1-...), though Python's IDNA 2003 codec refuses it (bidi rule 3). Reached here
    through an HTTP proxy, the edge itself (the request names the host in absolute form), so no
    name lookup is needed: the CLI refused it as "Invalid host" before sending anything."""
    port = urlsplit(server.base_url).port
    proxies = ("no_proxy", "all_proxy", "https_proxy")
    env = {k: v for k, v in checkout_env().items() if k.lower() not in proxies}
    env |= {"FLOODGATE_API_KEY": server.keys["paid"], "HTTP_PROXY": server.base_url}
    options = ["--temperature", "0", "--max-tokens", "4", "--base-url", f"http://{host}:{port}"]
    done = subprocess.run(
        [sys.executable, "-m", "floodgate_client", "chat", LONG_REPLY.prompt, *options],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip()


# What SmolLM2 answers in Chinese and with emoji, a delta at a time.
UNICODE_DELTAS = ["北京", "是一个", " 🎉", "🚀 ok"]


def _unicode_reply() -> bytes:
    encoder = ChunkEncoder("chatcmpl-unicode", "floodgate-tiny", 0)
    deltas = b"".join(encoder.delta(text) for text in UNICODE_DELTAS)
    return encoder.first() + deltas + encoder.final("length", None) + encoder.usage(9, 8) + DONE


def _ascii_terminal() -> io.TextIOWrapper:
    """A stream that cannot encode the reply: a Windows console or pipe (cp1252), PYTHONIOENCODING
    or a locale that is not UTF-8."""
    return io.TextIOWrapper(io.BytesIO(), encoding="ascii")


def _written(stream: io.TextIOWrapper) -> str:
    stream.flush()
    buffer = stream.buffer
    assert isinstance(buffer, io.BytesIO)
    return buffer.getvalue().decode("ascii")


def test_a_reply_the_terminal_cannot_encode_is_printed_not_a_traceback(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The first character the terminal could not encode raised UnicodeEncodeError out of the CLI,
    # a traceback in the middle of the reply (and the rest of it lost).
    edge = ScriptedEdge([_unicode_reply()])
    try:
        out, err = _ascii_terminal(), _ascii_terminal()
        assert _chat_offline(monkeypatch, ["chat", "hi", "--base-url", edge.base_url], out, err) == 0
        assert _written(out) == "????? ?? ok\n"
        assert "length" in _written(err)
    finally:
        edge.close()


def test_json_mode_keeps_the_reply_whole_on_a_terminal_that_cannot_encode_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # JSON can say any character in ASCII (\\u escapes): a reader gets the reply as the edge sent it.
    edge = ScriptedEdge([_unicode_reply()])
    try:
        out, err = _ascii_terminal(), _ascii_terminal()
        argv = ["chat", "hi", "--json", "--base-url", edge.base_url]
        assert _chat_offline(monkeypatch, argv, out, err) == 0, _written(err)
        events = [json.loads(line) for line in _written(out).splitlines()]
        assert [e["text"] for e in events if e["type"] == "text_delta"] == UNICODE_DELTAS
        assert events[-1]["type"] == "finished"
    finally:
        edge.close()


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e999"])
def test_a_temperature_json_cannot_carry_is_a_usage_error_not_a_traceback(
    value: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # float() takes these: the request's JSON encoding then raised ValueError ("Out of range float
    # values are not JSON compliant"), a traceback naming no option.
    out, err = io.StringIO(), io.StringIO()
    with pytest.raises(SystemExit) as exited:
        _chat_offline(
            monkeypatch,
            ["chat", "hi", f"--temperature={value}", "--base-url", "http://127.0.0.1:9"],
            out,
            err,
        )
    assert exited.value.code == 2
    assert "argument --temperature: must be a finite number" in capsys.readouterr().err


def test_the_client_distributions_cli_names_itself_in_its_usage() -> None:
    """`floodgate-client` (client/pyproject.toml; `python -m floodgate_client`) is the command an
    application that installed only the client has: its usage and errors said `floodgate chat`, a
    command that install does not have."""
    done = subprocess.run(
        [sys.executable, "-m", "floodgate_client", "chat", "hi", "--max-tokens", "many"],
        cwd=REPO,
        env=checkout_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.startswith("usage: floodgate-client chat "), done.stderr
    assert "floodgate-client chat: error: argument --max-tokens: invalid int value: 'many'" in done.stderr


def test_retry_does_not_wait_out_a_refusal_past_its_minute(monkeypatch: pytest.MonkeyPatch) -> None:
    # The README said `--retry` waits out a 429 as the edge advises: a spent free tier's request
    # window advises minutes (540 s measured), which the client's 60 s deadline does not wait, and
    # the command ended at once. What the README now says: one request, exit 1, the wait named.
    refused = (
        b"HTTP/1.1 429 Too Many Requests\r\ncontent-type: application/json\r\nretry-after: 540\r\n"
        b"retry-after-ms: 540000\r\nx-should-retry: false\r\nconnection: close\r\n"
    )
    body = json.dumps(
        {
            "error": {
                "message": "Rate limit reached (requests).",
                "type": "requests",
                "param": None,
                "code": "rate_limit_exceeded",
            }
        }
    ).encode()
    edge = ScriptedEdge([refused + f"content-length: {len(body)}\r\n\r\n".encode() + body])
    try:
        out, err = io.StringIO(), io.StringIO()
        argv = ["chat", "hi", "--retry", "--base-url", edge.base_url]
        assert _chat_offline(monkeypatch, argv, out, err) == 1, err.getvalue()
        assert edge.requests == 1
        assert re.search(r"retry in 5\d\d\.\d s", err.getvalue()), err.getvalue()
    finally:
        edge.close()


def test_a_second_ctrl_c_quits_at_once_when_the_edge_does_not_answer_the_cancel() -> None:
    """The first Ctrl-C's cancel unanswered (an edge gone silent: a real `floodgate serve` stopped
    with SIGSTOP took it so), the second is the user's "quit now". The stream's exit sent a second
    cancel and waited CANCEL_ON_EXIT_S (5 s) for its answer, printing nothing, and a third Ctrl-C
    there was a traceback in `floodgate-client`. Dropping the connection is the cancel already."""
    hold = threading.Event()
    encoder = ChunkEncoder("chatcmpl-silent", "floodgate-tiny", 0)
    edge = ScriptedEdge([encoder.first() + encoder.delta("hello")], hold_open=hold, hold_cancel=hold)
    try:
        proc = chat_cli(edge, "hi", "--json", key="fg-test")
        assert proc.stdout is not None
        for line in proc.stdout:
            if json.loads(line)["type"] == "text_delta":
                break
        proc.send_signal(signal.SIGINT)
        assert edge.cancel_asked.wait(timeout=30)  # the first Ctrl-C's handler has run
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 130, err
        assert "Traceback" not in err, err
        # No cancel sent on the way out, and so none waited for.
        assert edge.cancels == 1
    finally:
        hold.set()
        edge.close()


ESCAPES = ["Hi \x1b]0;owned\x07", "\x1b[2J\x1b[H", "\x9b31m done\tok\n"]


def _escaping_reply() -> bytes:
    encoder = ChunkEncoder("chatcmpl-escapes", "floodgate-tiny", 0)
    deltas = b"".join(encoder.delta(text) for text in ESCAPES)
    return encoder.first() + deltas + encoder.final("stop", None) + encoder.usage(3, 5) + DONE


def _cli_output(base_url: str, stdout: int) -> None:
    env = {**checkout_env(), "FLOODGATE_API_KEY": "fg-secret-key"}
    done = subprocess.run(
        [sys.executable, "-m", "floodgate_client", "chat", "hi", "--base-url", base_url],
        cwd=REPO,
        env=env,
        stdout=stdout,
        stderr=subprocess.PIPE,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr


def test_a_replys_control_characters_reach_a_terminal_shown_not_obeyed(tmp_path: Path) -> None:
    """The model's text, which a prompt can steer, reached the terminal as it came: an ESC sequence
    set the window's title or cleared the screen (and OSC 52 can write the clipboard). On a terminal
    they are shown as `cat -v` shows them; piped, the reply is written as it came."""
    edge = ScriptedEdge([_escaping_reply(), _escaping_reply()])
    try:
        main, replica = os.openpty()
        try:
            _cli_output(edge.base_url, replica)
            os.close(replica)
            shown = b""
            with contextlib.suppress(OSError):  # EIO once the pty's other end has closed
                while chunk := os.read(main, 65536):
                    shown += chunk
        finally:
            os.close(main)
        text = shown.decode()
        assert "\x1b" not in text and "\x07" not in text and "\x9b" not in text, repr(text)
        assert "Hi ^[]0;owned^G^[[2J^[[HM-^[31m done\tok" in text, repr(text)
        piped = tmp_path / "reply.txt"
        with piped.open("wb") as sink:
            _cli_output(edge.base_url, sink.fileno())
        assert piped.read_text() == "".join(ESCAPES) + "\n"
    finally:
        edge.close()
