"""HTTP/1.1 over a plain socket, for tests where the client must not decide when a connection
closes (httpx keeps, retries and closes connections by its own rules)."""

from __future__ import annotations

import socket


def get_healthz(sock: socket.socket, pipelined: bytes = b"") -> bytes:
    """One GET /healthz on `sock`, its response read to the last byte of its body; the head.
    `pipelined`: bytes of the next request, sent in the same write (before the response)."""
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: edge\r\n\r\n" + pipelined)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        assert chunk, f"closed mid-response: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        chunk = sock.recv(length - len(body))
        assert chunk, f"closed mid-body: {body!r}"
        body += chunk
    return head


def read_to_close(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data
