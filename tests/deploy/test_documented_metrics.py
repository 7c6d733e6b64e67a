"""Every metric a served edge's /metrics page has is named in docs/deploy.md (Metrics and logs).

The operator's guide named three of the edge's fifty-odd metrics: an on-call engineer had the HELP
lines to go by, and no word of which labels were bounded, which gauges return to 0 when idle, or
which refusal counter a client's 429 was in. A metric added since must be documented too."""

from __future__ import annotations

from pathlib import Path

from tests.deploy.documented import DEPLOY_DOC
from tests.support.live_server import start_server


def test_every_floodgate_metric_served_is_in_the_operators_guide(tmp_path: Path) -> None:
    with start_server(tmp_path) as edge:
        text = edge.metrics_text()
    served = {
        line.split()[2]
        for line in text.splitlines()
        if line.startswith("# TYPE floodgate_") and not line.split()[2].endswith("_created")
    }
    assert len(served) > 40, served
    guide = DEPLOY_DOC.read_text()
    assert sorted(name for name in served if f"`{name}`" not in guide) == []
