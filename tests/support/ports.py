"""Free loopback ports for the servers the tests start themselves (bench/free_ports.py: the
benchmarks the tests run draw from the same allocator)."""

from bench.free_ports import free_consecutive_ports, free_port

__all__ = ["free_consecutive_ports", "free_port"]
