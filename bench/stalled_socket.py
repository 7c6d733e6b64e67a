"""A chat stream over a socket with a tiny receive buffer that is never read: the slow reader the
edge must cut (its flow control stalls at once). Used by the long drills (bench/drills.py) and the
tests' short ones (tests/faults/)."""

from __future__ import annotations

import json
import socket

CHAT = "/v1/chat/completions"
RECEIVE_BUFFER = 4096


def open_stalled(base_url: str, key: str, body: dict[str, object]) -> socket.socket:
    """Send the request for `body` with `key` to the edge at `base_url`; the caller closes it."""
    host, port = base_url.removeprefix("http://").split(":")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER)  # before connect: the window
    sock.connect((host, int(port)))
    payload = json.dumps(body).encode()
    head = (
        f"POST {CHAT} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer {key}\r\nContent-Length: {len(payload)}\r\n\r\n"
    )
    sock.sendall(head.encode() + payload)
    return sock
