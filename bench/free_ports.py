"""Free loopback ports for the servers the tests and benchmarks start themselves.

A port the kernel hands out for `bind(0)` comes from the ephemeral range, the same range every
outgoing connection's source port is drawn from: between the test asking and its server binding,
one of the thousands of connections the other test processes open (to Redis, to the edges they
started) can take it, and the server exits "Address already in use" (CI's run of the fifty-second
pass lost `test_each_worker_fills_the_whole_of_its_own_engine` so). So the ports come from below the
ephemeral range, where no connection's source port lands, each pytest-xdist process drawing from a
slice of its own in turn, a port offered only once per process and only when a bind shows it free.
"""

from __future__ import annotations

import os
import random
import socket
import threading
from pathlib import Path

# Below the well-known services' usual ports (Postgres 5432, Redis 6379, 8000s, 9000s).
_LOWEST = 10_000
_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def _ephemeral_low() -> int:
    try:
        return int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768  # Linux's default


def _own_slice() -> range:
    """This test process's ports: the range below the ephemeral one split evenly between the
    pytest-xdist processes (the whole of it outside xdist)."""
    top = _ephemeral_low()
    if top - _LOWEST < 1_000:  # a machine whose ephemeral range starts low: no room below it
        return range(0)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    index = int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else 0
    width = (top - _LOWEST) // max(count, 1)
    start = _LOWEST + (index % max(count, 1)) * width
    return range(start, start + width)


class _PortCursor:
    """Walks this process's slice from a random point (a rerun straight after another starts where
    that run's ports are less likely still held), offering each port once."""

    def __init__(self) -> None:
        self._ports = _own_slice()
        self._next = random.randrange(len(self._ports)) if self._ports else 0
        self._lock = threading.Lock()

    def take(self, count: int) -> int | None:
        """The first of `count` consecutive ports all free now, or None where the slice is empty."""
        if not self._ports:
            return None
        with self._lock:
            for _ in range(len(self._ports)):
                if self._next + count > len(self._ports):
                    self._next = 0
                first = self._ports[self._next]
                self._next += count
                if _all_free(first, count):
                    return first
        raise RuntimeError(f"no {count} consecutive free loopback ports in {self._ports}")


def _all_free(first: int, count: int) -> bool:
    held: list[socket.socket] = []
    try:
        for offset in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            held.append(sock)
            sock.bind(("127.0.0.1", first + offset))
    except OSError:
        return False
    finally:
        for sock in held:
            sock.close()
    return True


_CURSOR = _PortCursor()


def free_port() -> int:
    return free_consecutive_ports(1)


def free_consecutive_ports(count: int) -> int:
    """The first of `count` consecutive free loopback ports, for a server that listens on port + i
    (`floodgate serve --workers N`'s operator listeners): a free port alone says nothing of the
    next one, which another test's server may hold."""
    first = _CURSOR.take(count)
    if first is not None:
        return first
    for _ in range(100):  # no room below the ephemeral range: the kernel's choice, as before
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            candidate = int(sock.getsockname()[1])
        if _all_free(candidate, count):
            return candidate
    raise RuntimeError(f"no {count} consecutive free loopback ports")
