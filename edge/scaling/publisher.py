"""Sends the scaling signal (demand.py, names in metric.py) to CloudWatch.

Sampling is a cheap synchronous read of the edge's own state; the network call runs in a worker
thread once per interval, so neither a slow CloudWatch nor a failing one touches request handling.
Each sample goes out as its own datums, and each call's samples are credited to one period: the one
the call is made in, or the next where the call comes within CREDIT_GUARD_S of that one's end
(a sample of a period that has ended is stamped at the start of the call's). With an interval that
divides the period, every period then gets its own intervals' samples, whole, before it ends: the
scaling policies' `Sum / samples per period` is the demand of the latest period they read. Stamped
with their own times, a period's samples came in two calls, the second up to an interval after the
period had ended, and a CloudWatch alarm evaluates what has arrived: the latest period read part of
every edge's share (4 of 6 samples from an edge whose calls go out at :25, 1 from one at :05).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import anyio.to_thread
import structlog
from prometheus_client import Counter

from edge.aws_client import aws_client
from edge.scaling import metric

if TYPE_CHECKING:
    from mypy_boto3_cloudwatch import CloudWatchClient
    from mypy_boto3_cloudwatch.type_defs import DimensionTypeDef

log = structlog.get_logger(__name__)

MAX_DATUMS_PER_CALL = 1000  # PutMetricData's limit
MAX_SAMPLES_PER_CALL = MAX_DATUMS_PER_CALL // 2  # two metrics per sample

PUBLISHES = Counter(
    "floodgate_cloudwatch_publishes_total", "PutMetricData calls that succeeded, by model.", ["model"]
)
PUBLISH_FAILURES = Counter(
    "floodgate_cloudwatch_publish_failures_total",
    "PutMetricData calls that failed (their samples are lost), by model.",
    ["model"],
)


# botocore's defaults wait 60 s for a reply and try 5 times: a CloudWatch gone silent (a black-holed
# path, a NAT or endpoint lost) held one call for minutes. Samples not sent within the interval are
# of no use, and the shutdown waits for the call out (aclose) ahead of the usage and message writers,
# which an orchestrator's stop timeout would then kill unwritten. PutMetricData answers in well
# under a second: two short tries.
CLIENT_BOUNDS: dict[str, Any] = {
    "connect_timeout": 2,
    "read_timeout": 3,
    "retries": {"mode": "standard", "total_max_attempts": 2},
}

# A call is credited to a period that ends at least this long after it is made: the call's own
# duration (well under a second; two tries of CLIENT_BOUNDS at worst) and CloudWatch's ingestion
# before the alarms read the period.
CREDIT_GUARD_S = float(metric.SAMPLE_INTERVAL_S)

# The close's bound: the lifespan closes the publisher ahead of the usage and message writers, and
# a deployment kills the edge 5 s after its drain deadline (docs/deploy.md, Graceful drain).
CLOSE_BUDGET_S = 1.0


def cloudwatch_client(region: str | None) -> CloudWatchClient:
    """The edge's CloudWatch client, its calls bounded (CLIENT_BOUNDS); `region` None: boto3's
    default chain."""
    client: CloudWatchClient = aws_client("cloudwatch", region_name=region, **CLIENT_BOUNDS)
    return client


class ScalingPublisher:
    """Samples `get_sample` (metric name -> value) every `sample_interval_s` and sends each
    interval's samples together: at most one PutMetricData call per `interval_s` from this instance."""

    def __init__(
        self,
        get_sample: Callable[[], Mapping[str, float]],
        *,
        dimensions: Mapping[str, str],
        client_factory: Callable[[], CloudWatchClient],
        interval_s: float = metric.PERIOD_S,
        sample_interval_s: float = metric.SAMPLE_INTERVAL_S,
        namespace: str = metric.NAMESPACE,
    ) -> None:
        if interval_s / sample_interval_s > MAX_SAMPLES_PER_CALL:
            raise ValueError(f"more than {MAX_SAMPLES_PER_CALL} samples per interval: sample less often")
        problem = metric.interval_problem(interval_s)
        if problem:
            raise ValueError(problem)
        self._get_sample = get_sample
        self._dimensions: list[DimensionTypeDef] = [{"Name": k, "Value": v} for k, v in dimensions.items()]
        model = dimensions.get(metric.MODEL_DIMENSION, "")
        self._published = PUBLISHES.labels(model=model)
        self._failed = PUBLISH_FAILURES.labels(model=model)
        self._client_factory = client_factory
        self._client: CloudWatchClient | None = None
        self._interval_s = interval_s
        self._sample_interval_s = sample_interval_s
        self._namespace = namespace
        self._samples: list[tuple[float, dict[str, float]]] = []  # (unix time, values by metric)
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()

    def sample(self) -> None:
        """Record the current value; a failing getter costs this one sample, never the loop."""
        try:
            values = {name: float(value) for name, value in self._get_sample().items()}
        except Exception as exc:
            log.warning("scaling_sample_failed", error=repr(exc))
            return
        self._samples.append((time.time(), values))

    async def flush(self, beat: float | None = None) -> bool:
        """Send the samples taken since the last flush, credited to the period of `beat` (the unix
        time the call is due, now when None; see the module doc); True when sent (or nothing to send)."""
        # Only the latest samples when flush() was not called for long: the rest are stale anyway.
        samples, self._samples = self._samples[-MAX_SAMPLES_PER_CALL:], []
        if not samples:
            return True
        samples = credited(samples, time.time() if beat is None else beat)
        try:
            # Abandoned when cancelled (the close's budget): the call ends in its thread, unawaited.
            await anyio.to_thread.run_sync(self._put, samples, abandon_on_cancel=True)
        except Exception as exc:
            # Not re-sent: a late backlog figure would mislead the scaler more than a missing one.
            self._failed.inc()
            log.warning("scaling_publish_failed", samples=len(samples), error=repr(exc))
            return False
        except BaseException:
            self._failed.inc()
            log.warning("scaling_publish_cut", samples=len(samples))
            raise
        self._published.inc()
        return True

    def start(self) -> None:
        if self._task is None:
            self._stopping = asyncio.Event()
            self._task = asyncio.get_running_loop().create_task(self._run(), name="scaling-publisher")

    async def aclose(self) -> None:
        """Stop sampling, let a call in flight finish, and send what was sampled since, within
        CLOSE_BUDGET_S: past it the call out is given up (its samples counted lost)."""
        with anyio.move_on_after(CLOSE_BUDGET_S) as budget:
            if self._task is not None:
                self._stopping.set()
                await self._task
            await self.flush()
        if self._task is not None and not self._task.done():
            # Cut while waiting for it: awaited, a task is cancelled with its awaiter, but not yet run.
            self._task.cancel()
            await asyncio.wait({self._task})  # its cancellation, not raised here
        self._task = None
        if budget.cancelled_caught:
            log.warning("scaling_close_cut", budget_s=CLOSE_BUDGET_S)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        next_sample = loop.time()
        next_flush = next_sample + self._interval_s
        while not self._stopping.is_set():
            self.sample()
            next_sample += self._sample_interval_s
            # Half a sample's slack: the sample that ends the interval is due at next_flush, up to a
            # float's rounding apart.
            if loop.time() >= next_flush - self._sample_interval_s / 2:
                # Credited by the beat, not by when the loop got to it: calls an interval apart
                # fill consecutive periods even where a beat falls at a period's guard.
                await self.flush(beat=time.time() + next_flush - loop.time())
                # On the interval's beat: timed from each call's end, the next call missed the
                # sample that ends its interval by the call's duration and went out a sample
                # later (a call every 70 s, 7 samples each). Only a call slower than the interval
                # (a loaded host, a slow CloudWatch) starts the beat again from its end, so that
                # it is not followed at once by another carrying a single sample.
                next_flush += self._interval_s
                if next_flush <= loop.time():
                    next_flush = loop.time() + self._interval_s
            # After a slow flush, skip the missed samples rather than take them in a burst.
            next_sample = max(next_sample, loop.time())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), next_sample - loop.time())

    def _put(self, samples: list[tuple[float, dict[str, float]]]) -> None:
        if self._client is None:
            self._client = self._client_factory()
        self._client.put_metric_data(
            Namespace=self._namespace,
            MetricData=[
                {
                    "MetricName": name,
                    "Dimensions": self._dimensions,
                    "Timestamp": datetime.fromtimestamp(at, UTC),
                    "Value": value,
                    "Unit": metric.UNIT,
                }
                for at, values in samples
                for name, value in values.items()
            ],
        )


Samples = list[tuple[float, dict[str, float]]]  # (unix time, values by metric), oldest first


def credited(samples: Samples, beat: float) -> Samples:
    """`samples` stamped into the period a call due at unix time `beat` is credited to."""
    period = metric.PERIOD_S
    start = (beat + CREDIT_GUARD_S) // period * period
    last = start + period - CREDIT_GUARD_S / 2  # within the period however late a sample was taken
    return [(min(max(at, start), last), values) for at, values in samples]
