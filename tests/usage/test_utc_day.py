"""utc_day's stamp of today (cached for the day) is the date of the clock's time, across midnight
and when the clock steps back."""

from __future__ import annotations

import time

import pytest

from edge.usage.record import utc_day

MIDNIGHT = 1764547200.0  # 2025-12-01T00:00:00Z


@pytest.mark.parametrize(
    "times",
    [
        [MIDNIGHT - 0.001, MIDNIGHT, MIDNIGHT + 86_399.9, MIDNIGHT + 86_400],  # forward over two midnights
        [MIDNIGHT + 10, MIDNIGHT - 10, MIDNIGHT + 10],  # a clock stepped back over midnight, and on
        [951_868_799.5, 951_868_800.0],  # into 2000-03-01, after a leap day
    ],
)
def test_today_is_the_clocks_date(monkeypatch: pytest.MonkeyPatch, times: list[float]) -> None:
    for now in times:
        monkeypatch.setattr(time, "time", lambda now=now: now)
        assert utc_day() == time.strftime("%Y-%m-%d", time.gmtime(now)) == utc_day(now)
