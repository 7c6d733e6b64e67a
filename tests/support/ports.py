"""Free loopback ports for the servers the tests start themselves (bench/free_ports.py: the
benchmarks the tests run draw from the same allocator), and whether one accepts connections."""

import socket

from bench.free_ports import free_consecutive_ports, free_port

__all__ = ["free_consecutive_ports", "free_port", "listening"]


def listening(port: int) -> bool:
    """Whether something accepts connections on the loopback port (a listener a drain has closed
    refuses them)."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1.0).close()
    except OSError:
        return False
    return True
