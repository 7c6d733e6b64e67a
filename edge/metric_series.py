"""The counter series an edge's settings name, made at 0 as it starts.

A labelled counter shows a series only from its first increment: until a tier's first failed
request, `rate(floodgate_requests_finished_total{reason="error"}[5m])` had no series at all (a
dashboard's "no data" where 0 was meant, an alert on it unable to tell a healthy edge from a broken
scrape), and that first increment was lost to rate(), which needs a sample before it to count one.
Made through `child`, so the hot path finds them where it looks.

Bounded: each served model by each configured tier, by fixed sets of reasons and limits (15 series
per model and tier, 3 more per model). The histograms are left to their first observation: each
series is twenty lines, and a quantile of no requests is no data either way. So is
floodgate_requests_rejected_total: its status and code pairs are many, most never seen.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import get_args

from edge import metrics
from edge.admission import metrics as queue_metrics
from edge.admission.ticket import OverloadReason
from edge.generation import EndReason
from edge.metric_children import child
from limiter.base import LimitName


def create_known_series(model: str, tiers: Iterable[str]) -> None:
    """Every counter series of `model` (its metrics label: "" on an edge serving one) and `tiers`."""
    for reason in get_args(OverloadReason):
        child(queue_metrics.REJECTED, model, reason)
    for tier in tiers:
        child(metrics.PROMPT_TOKENS, model, tier)
        child(metrics.GENERATION_TOKENS, model, tier)
        for end in get_args(EndReason):
            child(metrics.REQUESTS_FINISHED, model, tier, end)
        for limit in get_args(LimitName):
            child(metrics.RATE_LIMITED, model, tier, limit)
