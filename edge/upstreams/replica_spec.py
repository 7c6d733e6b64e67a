"""A running Triton replica as settings name it: `HOST:HTTP_PORT[:METRICS_PORT]`.

One home for reading it, so the settings' check at load (edge/config.py) refuses exactly what the
upstream's build (edge/upstreams/triton.py) could not use, and says why.
"""

from __future__ import annotations

from dataclasses import dataclass

# Triton's metrics port, where a spec names none.
TRITON_METRICS_PORT = 8002


@dataclass(frozen=True, slots=True)
class ReplicaAddress:
    host: str
    http_port: int
    metrics_port: int = TRITON_METRICS_PORT


def parse_replica_address(spec: str) -> ReplicaAddress:
    """`HOST:HTTP_PORT[:METRICS_PORT]`; a ValueError naming what is wrong with it."""
    parts = spec.strip().split(":")
    if len(parts) not in (2, 3) or not all(parts):
        raise ValueError(f"{spec.strip()!r} is not HOST:PORT[:METRICS_PORT]")
    # Whitespace inside the host (`gpu1 :8000`) built a replica on a host no lookup resolves: never
    # ready, every request a 503, nothing said why.
    if any(char.isspace() for char in parts[0]):
        raise ValueError(f"the host of {spec.strip()!r} holds a space")
    # ASCII digits only: str.isdigit() takes '²', which int() then refuses.
    if not all(part.isascii() and part.isdigit() for part in parts[1:]):
        raise ValueError(f"the ports of {spec.strip()!r} must be numbers")
    ports = [int(part) for part in parts[1:]]
    bad = [port for port in ports if not 1 <= port <= 65535]
    if bad:
        raise ValueError(f"port {bad[0]} is not within 1-65535")
    return ReplicaAddress(parts[0], *ports)
