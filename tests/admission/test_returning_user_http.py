"""A returning user's request that is placed at once, on a real server, is never refused as a wait
too long: its user's lead over the others of its tier (FairQueue.lead_waits) is a wait only for a
request that waits (edge/admission/wait_estimate.py)."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.admission.test_release_kinds_http import HANG, _hanging_replicas
from tests.edge.conftest import ROOMY_TIERS
from tests.edge.sse_client import CHAT, KEEPALIVE, events, wait_until
from tests.faults.test_failed_requests_cost_nothing import SHORT
from tests.support.live_server import start_server

# "team" shares the paid priority, and so its fair queue; neither tier waits at all.
_PAID_NOW = ROOMY_TIERS["paid"] | {"max_queue_wait_s": 0.0}
OVERRIDES = {
    "tiers": {"free": ROOMY_TIERS["free"], "paid": _PAID_NOW, "team": _PAID_NOW},
    "engine": {"max_num_seqs": 4},
    "admission": {"reserved_paid_fraction": 0.5},
    "server": {"keepalive_s": 0.02},
}


def test_a_returning_paid_user_with_room_is_served_beside_a_free_request_waiting(tmp_path: Path) -> None:
    """Two team streams hold the free tiers' half of the four sequences, so a free request waits;
    the paid user's first reply ends beside them, and its next request, with nothing of its tier
    waiting and two sequences free, was refused 429 wait_too_long: the estimate counted a dispatch
    for the team user's next request, which the paid one would have waited for only had it waited."""
    with (
        start_server(tmp_path, OVERRIDES, _hanging_replicas) as server,
        httpx.Client(base_url=server.base_url, timeout=60.0) as client,
    ):
        dispatcher = server.app.state.runtime.pipeline.dispatcher
        team, paid, free_user = server.auth("team"), server.auth("paid"), server.auth("free")
        hang = SHORT | {"max_tokens": HANG, "stream": True}
        with (
            client.stream("POST", CHAT, json=hang, headers=team),
            client.stream("POST", CHAT, json=hang, headers=team),
        ):
            wait_until(lambda: sum(r.sequences for r in dispatcher.replicas.members) == 2, what="team placed")
            with client.stream("POST", CHAT, json=SHORT | {"stream": True}, headers=free_user) as free:
                waiting = events(free)
                next(waiting)
                assert next(waiting) == KEEPALIVE and dispatcher.queue_depth() == 1

                first = client.post(CHAT, json=SHORT, headers=paid)
                again = client.post(CHAT, json=SHORT, headers=paid)
                assert dispatcher.queue_depth() == 1
    assert first.status_code == 200, first.text
    assert again.status_code == 200, again.text
