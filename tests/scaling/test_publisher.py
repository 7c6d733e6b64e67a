"""ScalingPublisher against CloudWatch (moto server): batching, one call per interval, failures."""

from __future__ import annotations

import asyncio
import itertools
import time
import types
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, cast

import anyio
import pytest
from prometheus_client import REGISTRY

from edge.scaling import ScalingPublisher, metric
from edge.scaling.publisher import cloudwatch_client
from tests.scaling.conftest import PutRecorder, aws_client, read_back
from tests.support.moto_server import REGION
from tests.support.ports import free_port
from tests.support.stalling_proxy import stalling_proxy
from tests.support.virtual_clock import VirtualClockLoop

pytestmark = pytest.mark.anyio

# The publisher's close budget (1 s), with room for a busy host: the writers after it have the
# rest of the 5 s a deployment leaves before its kill. A call to a silent CloudWatch within the
# client's own bounds (two tries of 3 s) took most of them.
CLOSE_BOUND_S = 3.0


def model_name() -> str:
    return f"model-{uuid.uuid4().hex[:8]}"


async def test_an_intervals_samples_go_out_in_one_call(recorder: PutRecorder, cloudwatch: Any) -> None:
    model = model_name()
    values = iter([1.0, 2.0, 3.0, 6.0])

    def sample() -> dict[str, float]:
        value = next(values)
        return {metric.DEMAND_METRIC: value, metric.REPLICA_LOAD_METRIC: value / 2}

    publisher = ScalingPublisher(sample, dimensions=metric.dimensions(model), client_factory=recorder.client)
    for _ in range(4):
        publisher.sample()

    assert await publisher.flush()

    assert len(recorder.calls) == 1
    assert read_back(cloudwatch, model, "Sum") == [12.0]
    assert read_back(cloudwatch, model, "SampleCount") == [4.0]
    assert read_back(cloudwatch, model, "Maximum") == [6.0]
    assert read_back(cloudwatch, model, "Maximum", metric.REPLICA_LOAD_METRIC) == [3.0]
    listed = cloudwatch.list_metrics(Namespace=metric.NAMESPACE, MetricName=metric.DEMAND_METRIC)
    dims = [m["Dimensions"] for m in listed["Metrics"]]
    assert [{"Name": metric.MODEL_DIMENSION, "Value": model}] in dims


async def test_nothing_sampled_means_no_call(recorder: PutRecorder) -> None:
    publisher = ScalingPublisher(
        lambda: {metric.DEMAND_METRIC: 1.0},
        dimensions=metric.dimensions(model_name()),
        client_factory=recorder.client,
    )

    assert await publisher.flush()
    assert recorder.calls == []


async def test_the_running_publisher_batches_each_interval_into_one_call(
    recorder: PutRecorder, cloudwatch: Any
) -> None:
    model = model_name()
    counter = itertools.count()
    publisher = ScalingPublisher(
        lambda: {metric.DEMAND_METRIC: float(next(counter))},
        dimensions=metric.dimensions(model),
        client_factory=recorder.client,
        interval_s=0.3,
        sample_interval_s=0.05,
    )
    publisher.start()
    arrived = await anyio.to_thread.run_sync(recorder.wait_for, 2)
    await publisher.aclose()

    assert arrived
    counts = [len(c["MetricData"]) for c in recorder.calls]
    assert all(n >= 2 for n in counts[:2]), counts
    # Every sample taken went out exactly once, in order: 0 + 1 + … + (n - 1).
    taken = int(sum(counts))
    assert read_back(cloudwatch, model, "Sum") == [float(taken * (taken - 1) // 2)]


async def test_a_failing_put_is_counted_and_its_samples_dropped(recorder: PutRecorder) -> None:
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    model = model_name()
    publisher = ScalingPublisher(
        lambda: {metric.DEMAND_METRIC: 3.0},
        dimensions=metric.dimensions(model),
        client_factory=lambda: aws_client("cloudwatch", dead),
    )
    failures = ("floodgate_cloudwatch_publish_failures_total", {"model": model})
    assert REGISTRY.get_sample_value(*failures) == 0.0
    publisher.sample()

    assert not await publisher.flush()
    assert REGISTRY.get_sample_value(*failures) == 1.0
    assert await publisher.flush()  # the failed interval's samples are not sent again


async def test_a_failing_getter_costs_one_sample(recorder: PutRecorder, cloudwatch: Any) -> None:
    model = model_name()
    answers = iter([2.0, None, 4.0])

    def value() -> dict[str, float]:
        answer = next(answers)
        if answer is None:
            raise RuntimeError("router not ready")
        return {metric.DEMAND_METRIC: answer}

    publisher = ScalingPublisher(value, dimensions=metric.dimensions(model), client_factory=recorder.client)
    for _ in range(3):
        publisher.sample()
    await publisher.flush()

    assert read_back(cloudwatch, model, "SampleCount") == [2.0]
    assert read_back(cloudwatch, model, "Sum") == [6.0]


def test_an_interval_must_fit_one_call() -> None:
    with pytest.raises(ValueError, match="samples per interval"):
        ScalingPublisher(
            lambda: {},
            dimensions=metric.dimensions("m"),
            client_factory=lambda: cast(Any, None),
            interval_s=60,
            sample_interval_s=0.01,
        )


async def test_a_silent_cloudwatch_holds_the_shutdown_for_one_bounded_call(
    moto_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CloudWatch gone silent (a black-holed path: connections accepted, nothing answered). The
    lifespan closes the publisher before the usage and message writers, which a stop timeout's
    SIGKILL would otherwise catch unwritten (botocore's defaults: 60 s a reply, 5 tries; the edge's
    client, 2 tries of 3 s): the close gives the call out up within its budget, left to end in its
    thread, its samples counted lost."""
    with stalling_proxy(int(moto_endpoint.rsplit(":", 1)[1])) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL_CLOUDWATCH", f"http://127.0.0.1:{proxy.port}")
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
        calling = anyio.Event()

        def client() -> Any:
            real = cloudwatch_client(REGION)
            real.meta.events.register(
                "provide-client-params.cloudwatch.PutMetricData",
                lambda **_: anyio.from_thread.run_sync(calling.set),
            )
            return real

        model = model_name()
        publisher = ScalingPublisher(
            lambda: {metric.DEMAND_METRIC: 1.0},
            dimensions=metric.dimensions(model),
            client_factory=client,
            interval_s=0.1,
            sample_interval_s=0.05,
        )
        proxy.black_hole()
        publisher.start()
        await calling.wait()  # a call is out, into the silence
        closing = asyncio.ensure_future(publisher.aclose())
        try:
            closed, _ = await asyncio.wait({closing}, timeout=CLOSE_BOUND_S)
        finally:
            proxy.close()  # what is still out meets a closed connection and ends
            await closing
        assert closed, f"the close was still held by a silent CloudWatch after {CLOSE_BOUND_S} s"
        failures = REGISTRY.get_sample_value("floodgate_cloudwatch_publish_failures_total", {"model": model})
        assert failures == 1.0  # the call out failed (no sample was taken while it was out)


def _publish_calls(
    loop: VirtualClockLoop, recorder: PutRecorder, model: str, calls: int, on_call: Callable[[], None]
) -> None:
    """A publisher of demand 1.0 run on `loop` until its `calls`th PutMetricData call has been
    answered, then closed; `on_call` runs as each call is made (in the call's thread)."""
    made = 0
    answered = asyncio.Event()

    def making(**_: Any) -> None:
        nonlocal made
        made += 1
        on_call()

    def sent(**_: Any) -> None:
        if made == calls:
            loop.call_soon_threadsafe(answered.set)

    def client() -> Any:
        real = recorder.client()
        real.meta.events.register("provide-client-params.cloudwatch.PutMetricData", making)
        real.meta.events.register("after-call.cloudwatch.PutMetricData", sent)
        return real

    async def main() -> None:
        publisher = ScalingPublisher(
            lambda: {metric.DEMAND_METRIC: 1.0}, dimensions=metric.dimensions(model), client_factory=client
        )
        publisher.start()
        await answered.wait()
        loop.hold()  # the close's budget is not spent at once while the last call returns
        await publisher.aclose()

    try:
        loop.run_until_complete(main())
    finally:
        loop.close()


def test_each_call_carries_one_intervals_samples(recorder: PutRecorder) -> None:
    """A minute's PutMetricData call takes time (here 0.5 s). The next was timed from its end, a
    minute and a half-second on, and so went out with the sample after that, 10 s late: one call
    every 70 s carrying 7 samples, each sample up to 70 s old when the scaling policies read it and
    every period's Sum incomplete for longer. The calls keep the interval's beat: 6 samples each."""
    loop = VirtualClockLoop()
    calls_at: list[float] = []

    def slow_put() -> None:
        calls_at.append(loop.time())
        loop.advance(0.5)

    _publish_calls(loop, recorder, model_name(), 5, slow_put)

    counts = [len(call["MetricData"]) for call in recorder.calls]
    # The first call also carries the sample taken at the start; every later one an interval's.
    assert counts[1:5] == [metric.SAMPLES_PER_PERIOD] * 4, counts
    gaps = [round(b - a, 3) for a, b in itertools.pairwise(calls_at[:5])]
    assert gaps == [float(metric.PERIOD_S)] * 4, gaps


def test_each_minute_reaches_cloudwatch_whole_before_it_ends(recorder: PutRecorder, cloudwatch: Any) -> None:
    """An edge started 25 s into a minute sends a call every minute at :25, each carrying the
    samples of the 60 s before it, stamped with their own times: a minute's samples came in two
    calls, the second 25 s after the minute had ended. A CloudWatch alarm evaluates the data that has
    arrived (the policies read the latest minute with 4 of its 6 samples: 2/3 of the demand, an
    edge started at :05 1/6), and every edge has its own phase. Each call is credited to one minute
    that has not ended yet, so a minute the policies read holds every edge's share of it whole."""
    loop = VirtualClockLoop()
    model = model_name()
    # 25 s into a minute an hour ago (CloudWatch takes data up to two weeks old).
    start_wall = time.time() // metric.PERIOD_S * metric.PERIOD_S - 3600 + 25.0
    made_at: list[float] = []  # each call's wall time

    def wall() -> float:
        return start_wall + loop.time()

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("edge.scaling.publisher.time", types.SimpleNamespace(time=wall))
        _publish_calls(loop, recorder, model, 4, lambda: made_at.append(wall()))

    minutes = []
    for call, at in zip(recorder.calls[:4], made_at, strict=True):
        credited = {int(d["Timestamp"].timestamp()) // metric.PERIOD_S for d in call["MetricData"]}
        assert len(credited) == 1, f"a call made at :{at % 60:.0f} fills minutes {sorted(credited)}"
        (minute,) = credited
        assert at < (minute + 1) * metric.PERIOD_S, "a call added to a minute that had ended"
        minutes.append(minute)
    # One call a minute, each a whole minute's samples: the policies' Sum / 6 is the demand (1.0).
    assert minutes == list(range(minutes[0], minutes[0] + 4)), minutes
    for minute in minutes[1:]:
        answer = cloudwatch.get_metric_statistics(
            Namespace=metric.NAMESPACE,
            MetricName=metric.DEMAND_METRIC,
            Dimensions=[{"Name": metric.MODEL_DIMENSION, "Value": model}],
            StartTime=datetime.fromtimestamp(minute * metric.PERIOD_S, UTC),
            EndTime=datetime.fromtimestamp((minute + 1) * metric.PERIOD_S, UTC),
            Period=metric.PERIOD_S,
            Statistics=["Sum"],
        )
        assert [p["Sum"] for p in answer["Datapoints"]] == [float(metric.SAMPLES_PER_PERIOD)], minute
