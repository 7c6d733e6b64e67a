"""The tiers as the edge ships them (edge/defaults.toml): limits, the longest queue wait before a
429, the largest max_tokens, and the reserved paid share. Read, not copied, so the simulation
follows the defaults."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

DEFAULTS = Path(__file__).resolve().parents[2] / "edge" / "defaults.toml"


@dataclass(frozen=True)
class Tier:
    name: str
    priority: int
    requests_per_window: int
    request_window_s: float
    tokens_per_window: int
    token_window_s: float
    max_tokens: int
    max_queue_wait_s: float


@dataclass(frozen=True)
class EdgeSettings:
    tiers: dict[str, Tier]
    reserved_paid_fraction: float
    max_queue: int  # per edge instance


def read(path: Path = DEFAULTS) -> EdgeSettings:
    data = tomllib.loads(path.read_text())
    tiers = {
        name: Tier(
            name=name,
            priority=int(t["priority"]),
            requests_per_window=int(t["requests_per_window"]),
            request_window_s=float(t["request_window_s"]),
            tokens_per_window=int(t["tokens_per_window"]),
            token_window_s=float(t["token_window_s"]),
            max_tokens=int(t["max_tokens"]),
            max_queue_wait_s=float(t["max_queue_wait_s"]),
        )
        for name, t in data["tiers"].items()
    }
    admission = data["admission"]
    return EdgeSettings(tiers, float(admission["reserved_paid_fraction"]), int(admission["max_queue"]))
