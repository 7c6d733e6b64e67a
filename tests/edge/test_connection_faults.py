"""A connection's life on a real server, over raw sockets: it ends when it should, and its answers
keep their order. Three faults a review of the HTTP layer showed (each test fails before its fix):
blank lines between requests held a kept-alive connection for ever, a pipelined request with a bad
URL wiped out the answer before it, and a stalled reader's cut freed its generation but not its
connection."""

from __future__ import annotations

import contextlib
import json
import logging
import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.stalled_socket import open_stalled
from tests.support.live_server import LiveServer, start_server
from tests.support.raw_http import get_healthz, read_to_close

GIVE_UP_S = 10.0


@pytest.fixture(scope="module")
def edge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    settings = {"server": {"header_timeout_s": 0.5, "http_keep_alive_s": 1.0}}
    with start_server(tmp_path_factory.mktemp("http-review"), settings) as live:
        yield live


def _connect(live: LiveServer) -> socket.socket:
    return socket.create_connection(("127.0.0.1", live.settings.server.port), timeout=GIVE_UP_S)


def _chat(live: LiveServer, *, stream: bool, max_tokens: int, version: bytes = b"1.1") -> bytes:
    payload = json.dumps(
        {
            "model": "floodgate-tiny",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "stream": stream,
        }
    ).encode()
    return (
        b"POST /v1/chat/completions HTTP/" + version + b"\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"authorization: Bearer " + live.keys["paid"].encode() + b"\r\n"
        b"content-length: %d\r\n\r\n" % len(payload) + payload
    )


def test_blank_lines_between_requests_do_not_hold_a_kept_alive_connection(edge: LiveServer) -> None:
    """llhttp skips CR/LF before a request line without beginning a message, so no header deadline
    starts; the bytes cancel uvicorn's keep-alive timer, which nothing re-arms. A client (no key
    needed) sending "\\r\\n" now and then after one answer held the connection for ever."""
    with _connect(edge) as sock:
        assert get_healthz(sock).startswith(b"HTTP/1.1 200 ")
        sock.settimeout(0.2)
        closed = False
        deadline = time.monotonic() + 5.0  # 10x the header deadline, 5x the keep-alive
        while time.monotonic() < deadline and not closed:
            try:
                sock.sendall(b"\r\n")
                closed = sock.recv(1) == b""
            except TimeoutError:
                continue
            except OSError:
                closed = True
    assert closed, "a trickle of blank lines held the kept-alive connection past both timeouts"


def test_a_pipelined_request_with_a_bad_url_does_not_destroy_the_answer_before_it(edge: LiveServer) -> None:
    """httptools.parse_url raises in uvicorn's on_headers_complete, after the edge's override has
    marked the headers done: send_400_response takes it for bad framing in the running request's
    body and writes the 400 at once, then closes: the valid chat before it gets no answer at all
    (the same shape as the 431/400 cases of test_header_size.py, which are answered in order)."""
    with _connect(edge) as sock:
        sock.sendall(_chat(edge, stream=True, max_tokens=200) + b"GET http://[/ HTTP/1.1\r\nhost: x\r\n\r\n")
        answers = read_to_close(sock)
    assert re.findall(rb"HTTP/1\.1 (\d{3}) ", answers) == [b"200", b"400"]
    assert b"data: [DONE]" in answers


def _stalled_cut(live: LiveServer) -> float:
    match = re.search(r"^floodgate_stalled_readers_cut_total ([0-9.e+]+)$", live.metrics_text(), re.M)
    return float(match.group(1)) if match else 0.0


def test_a_stalled_reader_cut_also_frees_its_connection(tmp_path: Path) -> None:
    """The cut frees the generation, then uvicorn closes the transport (the response was left
    unfinished): close() waits to flush its buffer, which a reader that never reads never takes.
    The socket, its buffers and the protocol stay until the client itself goes: a client that
    opens streams and never reads them holds a file descriptor each, for ever, while the gate
    counts none of them."""
    settings = {"server": {"stalled_reader_s": 1.0, "send_buffer_bytes": 4096}}
    with start_server(tmp_path, settings) as live:
        body = {
            "model": "floodgate-tiny",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 1900,
            "ignore_eos": True,
            "stream": True,
        }
        sock = open_stalled(live.base_url, live.keys["paid"], body)
        try:
            port = sock.getsockname()[1]
            connections = live._server.server_state.connections

            def held() -> bool:
                return any(c.client is not None and c.client[1] == port for c in list(connections))

            deadline = time.monotonic() + 30
            while _stalled_cut(live) < 1 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert _stalled_cut(live) == 1
            deadline = time.monotonic() + 5
            while held() and time.monotonic() < deadline:
                time.sleep(0.05)
            assert not held(), "the cut stream's connection is still open"
        finally:
            sock.close()


def _head_and_body(answer: bytes) -> tuple[dict[bytes, bytes], bytes]:
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    assert lines[0] == b"HTTP/1.1 200 OK", answer[:300]
    fields = dict(line.lower().split(b": ", 1) for line in lines[1:])
    return fields, body


def test_an_http_1_0_client_gets_each_reply_framed_the_way_1_0_knows(edge: LiveServer) -> None:
    """HTTP/1.0 has no chunked coding (RFC 9112 7.1: a server must not send it to a 1.0 client):
    a stream, whose length is not known ahead, ends where the connection closes, its events as
    they are. uvicorn's httptools protocol framed it chunked all the same, so a 1.0 client read
    the chunk sizes as part of the event stream (and no end). Long enough for the tokens to take
    the edge's own write (edge/body_chunks.py) as well as the send. A whole reply keeps its
    content-length."""
    with _connect(edge) as sock:
        sock.sendall(_chat(edge, stream=True, max_tokens=24, version=b"1.0"))
        streamed = read_to_close(sock)
    with _connect(edge) as sock:
        sock.sendall(_chat(edge, stream=False, max_tokens=4, version=b"1.0"))
        whole = read_to_close(sock)

    fields, body = _head_and_body(streamed)
    assert b"transfer-encoding" not in fields and b"content-length" not in fields, fields
    assert fields[b"connection"] == b"close"
    events = body.split(b"\n\n")
    assert events[-2:] == [b"data: [DONE]", b""], body[-200:]
    chunks = [json.loads(e.removeprefix(b"data: ")) for e in events[:-2]]
    choices = [c["choices"][0] for c in chunks if c["choices"]]
    assert choices[-1]["finish_reason"] == "length"
    assert len([c for c in choices if c["delta"].get("content")]) > 10

    fields, body = _head_and_body(whole)
    assert b"transfer-encoding" not in fields
    assert int(fields[b"content-length"]) == len(body)
    assert json.loads(body)["usage"]["completion_tokens"] == 4


def test_an_http_1_0_client_that_sends_expect_gets_no_interim_answer(edge: LiveServer) -> None:
    """RFC 9110 10.1.1 and 15.2: a 100-continue expectation in an HTTP/1.0 request is ignored, and
    a 1.0 client is never sent a 1xx (it knows none: the first status line it reads is its answer).
    uvicorn wrote "100 Continue" to it all the same, so a 1.0 client read a 100 with the real answer
    as its body. A 1.1 client still gets its 100 first."""
    answers = {}
    expecting = b"host: x\r\nexpect: 100-continue\r\nconnection: close\r\n"
    for version in (b"1.0", b"1.1"):
        request = _chat(edge, stream=False, max_tokens=2, version=version)
        request = request.replace(b"host: x\r\n", expecting, 1)
        with _connect(edge) as sock:
            sock.sendall(request)
            answers[version] = read_to_close(sock)
    assert answers[b"1.0"].startswith(b"HTTP/1.1 200 OK\r\n"), answers[b"1.0"][:100]
    continued = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\n"
    assert answers[b"1.1"].startswith(continued), answers[b"1.1"][:100]


def _expecting(live: LiveServer) -> tuple[bytes, bytes]:
    """A chat asking for 100 Continue: its head, and its body (to send once told to)."""
    head, _, body = _chat(live, stream=False, max_tokens=2).partition(b"\r\n\r\n")
    return head + b"\r\nexpect: 100-continue\r\n\r\n", body


@pytest.mark.parametrize("refused", ["bad_key", "too_large"])
def test_a_request_refused_before_its_expected_body_closes_its_connection(
    edge: LiveServer, refused: str
) -> None:
    """RFC 9110 10.1.1: a request answered from its headers alone (a bad key's 401, a body past the
    limit's 413) gets its final answer with no 100, and the server must then say whether it reads
    the body it never asked for. The answer said nothing and the connection waited for that body: a
    client that reused it had its next request read as the body, and met no answer at all, then a
    close at the header deadline. As nginx and h11, the answer says `connection: close`, and the
    connection closes."""
    head, _ = _expecting(edge)
    if refused == "bad_key":
        head, status = head.replace(edge.keys["paid"].encode(), b"not-a-key"), b"401"
    else:
        head, status = re.sub(rb"content-length: \d+", b"content-length: 2000000", head), b"413"
    with _connect(edge) as sock:
        sock.sendall(head)
        answer = sock.recv(65536)
        assert answer, "closed unanswered"
        with contextlib.suppress(OSError):  # closed already: what came is still there to read
            sock.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")  # the connection reused
        answer += read_to_close(sock)
    assert re.findall(rb"HTTP/1\.1 (\d{3}) ", answer) == [status], answer[:400]
    assert b"connection: close" in answer.partition(b"\r\n\r\n")[0].split(b"\r\n"), answer[:400]


def test_a_request_that_waits_for_its_100_continue_is_served_on_a_kept_connection(
    edge: LiveServer,
) -> None:
    """The other side of the refusal above: a request the edge reads gets its 100 first, and its
    connection, its body all read, stays open for the next request."""
    head, body = _expecting(edge)
    with _connect(edge) as sock:
        sock.sendall(head)
        interim = b""
        while b"\r\n\r\n" not in interim:
            chunk = sock.recv(1)
            assert chunk, interim
            interim += chunk
        assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
        sock.sendall(body + b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        answers = read_to_close(sock)
    assert re.findall(rb"HTTP/1\.1 (\d{3}) ", answers) == [b"200", b"200"], answers[:400]


@pytest.mark.parametrize("upgrade", [b"h2c", b"websocket"])
def test_a_request_asking_for_an_upgrade_still_has_its_body_read(edge: LiveServer, upgrade: bytes) -> None:
    """`curl --http2` to an http:// URL asks for an h2c upgrade on its first request, POST included.
    httptools takes any request with Upgrade and `Connection: upgrade` to end at its headers: the
    body was skipped, the app read an empty one, and the chat was a 400 "could not parse the JSON
    body" (by Content-Length or chunked alike). Answered as HTTP, it is read as HTTP; the connection
    still closes after it (nothing after an upgrade is taken for a request)."""
    asking = b"host: x\r\nconnection: Upgrade, HTTP2-Settings\r\nupgrade: " + upgrade + b"\r\n"
    request = _chat(edge, stream=False, max_tokens=2).replace(b"host: x\r\n", asking, 1)
    head, _, payload = request.partition(b"\r\n\r\n")
    chunked = re.sub(rb"content-length: \d+", b"transfer-encoding: chunked", head) + b"\r\n\r\n"
    chunked += b"%x\r\n%b\r\n0\r\n\r\n" % (len(payload), payload)
    last = b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n"
    for framed in (request, chunked):
        with _connect(edge) as sock:
            sock.sendall(framed + last)
            answer = read_to_close(sock)
        assert re.findall(rb"HTTP/1\.1 (\d{3}) ", answer) == [b"200"], answer[:400]
        fields, body = _head_and_body(answer)
        assert fields[b"connection"] == b"close"
        assert json.loads(body)["usage"]["completion_tokens"] == 2


@pytest.mark.parametrize(
    ("request_line", "status", "code"),
    [
        (b"GET /healthz HTTP/2.0\r\nhost: x\r\n\r\n", b"505", "http_version_not_supported"),
        # HTTP/0.9's request line, no version: no HTTP/1 request at all.
        (b"GET /healthz\r\n\r\n", b"400", "invalid_http_request"),
    ],
)
def test_a_request_of_a_version_not_served_is_refused(
    edge: LiveServer, request_line: bytes, status: bytes, code: str
) -> None:
    """llhttp parses HTTP/2.0 and a request line with no version (0.9) as well as 1.x, and both were
    served as 1.0 and closed: an h2 client read an HTTP/1 answer it cannot parse, a 0.9 one a head
    it never asked for. As nginx: 505 for another major version, 400 for a malformed request line,
    each an error object with its id, and the connection closes."""
    with _connect(edge) as sock:
        sock.sendall(request_line)
        answer = read_to_close(sock)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert re.findall(rb"HTTP/1\.1 (\d{3}) ", answer) == [status], answer[:300]
    assert b"\r\nx-request-id: req-" in head and b"\r\nconnection: close" in head, head
    assert json.loads(body)["error"]["code"] == code


class _Errors(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def _exchange_watching_errors(live: LiveServer, request: bytes) -> tuple[bytes, list[str]]:
    """The answer, and the errors the loop logged meanwhile (a protocol callback that raised is
    uvloop's "Fatal error on transport", on asyncio's logger)."""
    errors = _Errors()
    logging.getLogger("asyncio").addHandler(errors)
    try:
        with _connect(live) as sock:
            sock.sendall(request)
            try:
                answer = read_to_close(sock)
            except ConnectionResetError:
                answer = b"(reset)"
    finally:
        logging.getLogger("asyncio").removeHandler(errors)
    return answer, [record.getMessage() for record in errors.records]


def test_a_connect_request_is_refused_not_replayed_for_ever(edge: LiveServer) -> None:
    """llhttp takes every CONNECT for a tunnel, Upgrade header or not, and the edge reads a request
    that asked for an upgrade again, less its Upgrade header: a CONNECT asked again, and again,
    until a RecursionError. No answer, and some 8,000 traceback lines logged for each such request
    (no key needed)."""
    answer, errors = _exchange_watching_errors(edge, b"CONNECT example.com:443 HTTP/1.1\r\nhost: x\r\n\r\n")
    assert not errors, errors[:3]
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 "), answer[:300]
    assert b"\r\nx-request-id: req-" in head and b"\r\nconnection: close" in head, head
    assert json.loads(body)["error"]["code"] == "invalid_http_request"
    with _connect(edge) as sock:
        assert get_healthz(sock).startswith(b"HTTP/1.1 200 ")


def test_many_upgrade_requests_in_one_read_do_not_overflow_the_stack(edge: LiveServer) -> None:
    """Each request that asks for an upgrade was read again by a call within the one before: 1,500
    of them in one write (90 KB) went past Python's recursion limit, and the connection was dropped
    with a traceback thousands of lines long. More than MAX_PIPELINED of them close the connection
    unanswered, as any other requests do."""
    asking = b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: upgrade\r\nupgrade: h2c\r\n\r\n"
    _, errors = _exchange_watching_errors(edge, asking * 1500)
    assert not errors, errors[:3]
    with _connect(edge) as sock:
        assert get_healthz(sock).startswith(b"HTTP/1.1 200 ")


def test_an_http_1_0_request_with_a_transfer_encoding_is_refused(edge: LiveServer) -> None:
    """RFC 9112 6.1: an HTTP/1.0 message with a Transfer-Encoding header has faulty framing (a 1.0
    sender knows no transfer coding; whatever sits in front and reads it as 1.0 sees no body, and
    its chunks as the next request), answered 400 as nginx answers it. llhttp read the chunks and
    the chat was served. The same request as HTTP/1.1 still is."""
    payload = json.dumps(
        {"model": "floodgate-tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    ).encode()
    chat = (
        b"POST /v1/chat/completions HTTP/%b\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"authorization: Bearer " + edge.keys["paid"].encode() + b"\r\n"
        b"transfer-encoding: chunked\r\nconnection: close\r\n\r\n"
        b"%x\r\n%b\r\n0\r\n\r\n"
    )
    with _connect(edge) as sock:
        sock.sendall(chat % (b"1.0", len(payload), payload))
        answer = read_to_close(sock)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert re.findall(rb"HTTP/1\.1 (\d{3}) ", answer) == [b"400"], answer[:300]
    assert b"\r\nx-request-id: req-" in head and b"\r\nconnection: close" in head, head
    assert json.loads(body)["error"]["code"] == "invalid_http_request"
    with _connect(edge) as sock:
        sock.sendall(chat % (b"1.1", len(payload), payload))
        assert read_to_close(sock).startswith(b"HTTP/1.1 200 ")


def test_a_request_with_no_host_or_two_is_refused(edge: LiveServer) -> None:
    """RFC 9112 3.2: an HTTP/1.1 request without a Host header, or any request with more than one,
    must be answered 400 (h11, uvicorn's other protocol, and nginx do). Both were served: two
    hosts are two readings of where a request goes, one for whatever sits in front, one here. An
    HTTP/1.0 request (no Host required) with one or none is still served."""
    get = b"GET /healthz HTTP/%b\r\n%bconnection: close\r\n\r\n"
    refused = ((b"1.1", b""), (b"1.1", b"host: a\r\nhost: b\r\n"), (b"1.0", b"host: a\r\nhost: a\r\n"))
    for version, hosts in refused:
        with _connect(edge) as sock:
            sock.sendall(get % (version, hosts))
            answer = read_to_close(sock)
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 400 "), (version, hosts, answer[:300])
        assert b"\r\nx-request-id: req-" in head, head
        assert json.loads(body)["error"]["code"] == "invalid_http_request"
    for version, hosts in ((b"1.1", b"host: a\r\n"), (b"1.0", b"")):
        with _connect(edge) as sock:
            sock.sendall(get % (version, hosts))
            assert read_to_close(sock).startswith(b"HTTP/1.1 200 "), (version, hosts)
