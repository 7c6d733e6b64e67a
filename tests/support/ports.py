"""Free loopback ports for the servers the tests start themselves."""

from __future__ import annotations

import socket


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def free_consecutive_ports(count: int) -> int:
    """The first of `count` consecutive free loopback ports, for a server that listens on port + i
    (`floodgate serve --workers N`'s operator listeners): a free port alone says nothing of the
    next one, which another test's server may hold."""
    for _ in range(100):
        first = free_port()
        held: list[socket.socket] = []
        try:
            for offset in range(count):
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                held.append(sock)
                sock.bind(("127.0.0.1", first + offset))
        except OSError:
            continue
        finally:
            for sock in held:
                sock.close()
        return first
    raise RuntimeError(f"no {count} consecutive free loopback ports")
