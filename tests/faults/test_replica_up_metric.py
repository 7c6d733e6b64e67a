"""A replica that stops passing its health checks (a hung or dead Triton host) is 0 in
`floodgate_replica_up`: before, its gauges kept the values of its last passing check, so a dashboard
showed it running its sequences, and nothing on /metrics said it was down. On a real edge whose one
replica's readiness the test turns off."""

from __future__ import annotations

import threading
from pathlib import Path

from edge.upstreams.base import Upstream
from tests.edge.sse_client import wait_until
from tests.support.live_server import start_server
from tests.support.scripted_replicas import Replicas, ScriptedReplica, wrapped_replicas

UP = 'floodgate_replica_up{model="",replica="local-0"}'


class _Failing(ScriptedReplica):
    """The real replica, whose health check fails once `down` is set."""

    def __init__(self, inner: Upstream, down: threading.Event) -> None:
        super().__init__(inner, lambda up, req: up.generate(req))
        self._down = down

    async def ready(self) -> bool:
        return not self._down.is_set() and await self._inner.ready()


def _replicas(down: threading.Event) -> Replicas:
    return wrapped_replicas(lambda up: _Failing(up, down))


def _value(text: str, series: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_a_replica_failing_its_health_checks_is_down_on_the_metrics_page(tmp_path: Path) -> None:
    down = threading.Event()
    with start_server(tmp_path, upstreams=_replicas(down)) as edge:
        assert _value(edge.metrics_text(), UP) == 1.0
        down.set()
        wait_until(lambda: _value(edge.metrics_text(), UP) == 0.0, what="the replica reported down")
        # Its capacity gauges are still there, as its last passing check read them.
        assert 'floodgate_replica_kv_tokens{model="",replica="local-0"}' in edge.metrics_text()
        down.clear()
        wait_until(lambda: _value(edge.metrics_text(), UP) == 1.0, what="the replica reported up again")
