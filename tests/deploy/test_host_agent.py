"""The GPU host agent (gpu_container/triton/host_agent.py): its decisions, then the same agent
against a real Auto Scaling API (moto's server) with loopback HTTP servers standing in for the
instance metadata service and Triton (the host's own endpoints)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal

import pytest
from structlog.testing import capture_logs

from gpu_container.triton.host_agent import (
    AwsHost,
    CompleteHook,
    HostAgent,
    Observation,
    SetUnhealthy,
    aws_clients,
    gpu_datums,
    take_round,
)
from gpu_container.triton.trtllm_metrics import active_requests
from tests.iac.hcl import MODULES, module
from tests.scaling.conftest import aws_client, moto_endpoint  # noqa: F401 (fixture)
from tests.support.moto_server import REGION
from tests.support.refusing_autoscaling import refusing_autoscaling
from tests.support.stalling_proxy import stalling_proxy

METRICS = """# HELP nv_trt_llm_request_metrics TRT LLM request metrics
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="active",version="1"} 3
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="scheduled",version="1"} 2
nv_gpu_utilization{gpu_uuid="GPU-abc"} 0.97
nv_gpu_memory_used_bytes{gpu_uuid="GPU-abc"} 4.2e+10
"""


def agent() -> HostAgent:
    return HostAgent(ready_timeout_s=600, drain_s=300, unhealthy_after_s=60, started_at=0)


def seen(
    state: str = "InService",
    ready: bool = True,
    streams: int = 0,
    now: float = 0,
    lifecycle: str | None = "Pending:Wait",
) -> Observation:
    return Observation(state, ready, streams, now, lifecycle)


def test_the_launch_completes_once_triton_is_ready() -> None:
    a = agent()

    assert a.step(seen(ready=False, now=10)) == []
    assert a.step(seen(ready=True, now=20)) == [CompleteHook("ready", "CONTINUE")]
    assert CompleteHook("ready", "CONTINUE") not in a.step(seen(now=30))


def test_a_triton_that_never_gets_ready_abandons_the_launch() -> None:
    a = agent()

    assert a.step(seen(ready=False, now=599)) == []
    assert a.step(seen(ready=False, now=600)) == [CompleteHook("ready", "ABANDON")]


def test_entering_the_warm_pool_waits_for_the_engine_too() -> None:
    a = agent()

    assert a.step(seen("Warmed:Stopped", ready=False, now=5)) == []
    assert a.step(seen("Warmed:Stopped", ready=True, now=6)) == [CompleteHook("ready", "CONTINUE")]


def test_a_launch_the_api_has_not_described_yet_still_completes_and_abandons() -> None:
    """The Auto Scaling API not answered yet (throttled, unreachable): a launch hook may be
    pending, so the agent acts as on a fresh launch until it knows."""
    a = agent()

    assert a.step(seen(ready=False, now=599, lifecycle=None)) == []
    assert a.step(seen(ready=False, now=600, lifecycle=None)) == [CompleteHook("ready", "ABANDON")]


@pytest.mark.parametrize("lifecycle", ["Pending", "Pending:Wait", "Warmed:Pending:Wait"])
def test_a_launch_hook_the_api_says_is_pending_waits_for_the_engine(lifecycle: str) -> None:
    a = agent()

    assert a.step(seen(ready=False, now=300, lifecycle=lifecycle)) == []
    assert a.step(seen(ready=False, now=599, lifecycle=lifecycle)) == []  # not Unhealthy meanwhile
    assert a.step(seen(ready=False, now=600, lifecycle=lifecycle)) == [CompleteHook("ready", "ABANDON")]


@pytest.mark.parametrize("lifecycle", ["InService", "Pending:Proceed"])
def test_an_agent_restarted_past_the_launch_watches_triton_at_once(lifecycle: str) -> None:
    """The agent restarted (the host rebooted, its container crashed) on a host already launched,
    and Triton did not come back. The metadata's target state reads InService there as while the
    launch hook waits: the agent took it for a fresh launch, waited out the ready timeout (29
    minutes by default) before abandoning a hook no longer pending, and only then began its 60 s
    health watch. The Auto Scaling API tells the two apart."""
    a = agent()

    assert a.step(seen(ready=False, now=0, lifecycle=lifecycle)) == []
    assert a.step(seen(ready=False, now=60, lifecycle=lifecycle)) == [SetUnhealthy()]
    assert CompleteHook("ready", "ABANDON") not in a.step(seen(ready=False, now=600, lifecycle=lifecycle))


def test_an_agent_restarted_during_a_scale_in_to_the_warm_pool_drains_the_host() -> None:
    """Restarted in service as the group takes the host back to the warm pool (target
    Warmed:Stopped): that is a drain, not a launch into the pool."""
    a = agent()

    assert a.step(seen("Warmed:Stopped", streams=2, now=0, lifecycle="InService")) == []
    assert a.step(seen("Warmed:Stopped", streams=0, now=20, lifecycle="InService")) == [
        CompleteHook("drain", "CONTINUE")
    ]


def test_a_host_back_in_service_from_a_running_warm_pool_completes_its_launch_hook_again() -> None:
    """A warm pool kept running (or hibernated) keeps the agent running with its host: launched,
    scaled in to the pool, moved into service again. The move pauses the host at Pending:Wait for
    the launch hook again; the agent, its launch done long ago, only watched its health, and the
    hook timed out with ABANDON: the group threw away a host whose engine was loaded."""
    a = agent()
    assert a.step(seen(now=0)) == [CompleteHook("ready", "CONTINUE")]
    assert a.step(seen(now=10, lifecycle="InService")) == []
    assert a.step(seen("Warmed:Running", streams=0, now=100, lifecycle="Warmed:Pending:Wait")) == []
    assert a.step(seen("Warmed:Running", streams=0, now=120, lifecycle="Warmed:Pending:Wait")) == [
        CompleteHook("drain", "CONTINUE")
    ]
    assert a.step(seen("Warmed:Running", now=130, lifecycle="Warmed:Running")) == []  # in the pool

    assert a.step(seen(ready=False, now=5000, lifecycle="Pending:Wait")) == []  # not Unhealthy
    assert a.step(seen(ready=False, now=5060, lifecycle="Pending:Wait")) == []
    assert a.step(seen(ready=True, now=5070, lifecycle="Pending:Wait")) == [CompleteHook("ready", "CONTINUE")]
    assert a.step(seen(now=5080, lifecycle="Pending:Wait")) == []
    # In service again: its next scale-in is drained as the first was.
    assert a.step(seen("Warmed:Running", streams=0, now=6000, lifecycle="Warmed:Pending:Wait")) == []
    assert a.step(seen("Warmed:Running", streams=0, now=6020, lifecycle="Warmed:Pending:Wait")) == [
        CompleteHook("drain", "CONTINUE")
    ]


def test_an_agent_restarted_in_a_running_warm_pool_completes_the_launch_hook_of_the_move_into_service() -> (
    None
):
    """Restarted in the pool (Warmed:Running: no hook pending), the agent took the host for one long
    launched, and its move into service, hook and all, for service as usual. The ready timeout
    counts from the move."""
    a = agent()
    assert a.step(seen("Warmed:Running", now=0, lifecycle="Warmed:Running")) == []

    assert a.step(seen(ready=False, now=1000, lifecycle="Pending:Wait")) == []
    assert a.step(seen(ready=False, now=1599, lifecycle="Pending:Wait")) == []
    assert a.step(seen(ready=False, now=1600, lifecycle="Pending:Wait")) == [CompleteHook("ready", "ABANDON")]


@pytest.mark.parametrize("lifecycle", ["Warmed:Pending", "Warmed:Pending:Wait"])
def test_an_agent_restarted_on_its_way_into_the_warm_pool_completes_either_hook(lifecycle: str) -> None:
    """Restarted while the host is paused on its way into the warm pool: a launch into it (the
    launch hook) and a scale-in back to it (the terminate hook) read the same. The agent took every
    such host for a launch: a scale-in's terminate hook was never completed. It sends the launch's
    CONTINUE and, once idle past `min_drain_s`, the drain's: AWS takes the one pending."""
    a = agent()
    assert a.step(seen("Warmed:Stopped", ready=False, streams=1, now=0, lifecycle=lifecycle)) == []
    assert a.step(seen("Warmed:Stopped", ready=True, streams=1, now=10, lifecycle=lifecycle)) == [
        CompleteHook("ready", "CONTINUE")
    ]
    assert a.step(seen("Warmed:Stopped", streams=0, now=20, lifecycle=lifecycle)) == [
        CompleteHook("drain", "CONTINUE")
    ]
    assert a.step(seen("Warmed:Stopped", streams=0, now=30, lifecycle=lifecycle)) == []


@pytest.mark.parametrize("into_pool", ["launched", "scaled in"])
def test_a_host_terminated_from_a_running_warm_pool_is_drained(into_pool: str) -> None:
    """A warm pool kept running keeps the agent running with its host, and the group may terminate
    the host from the pool (the pool shrunk, an instance refresh): the terminate hook pauses it
    again. The agent's drain on the way into the pool (a scale-in's, or the one it runs beside the
    launch, not knowing which hook pauses the host) counted as done, so this one was never
    completed and held a running GPU for the hook's whole heartbeat."""
    a = agent()
    if into_pool == "launched":
        assert a.step(seen("Warmed:Running", now=0, lifecycle="Warmed:Pending:Wait")) == [
            CompleteHook("ready", "CONTINUE")
        ]
        assert a.step(seen("Warmed:Running", now=20, lifecycle="Warmed:Pending:Wait")) == [
            CompleteHook("drain", "CONTINUE")  # AWS refuses it: the launch hook paused the host
        ]
    else:
        assert a.step(seen(now=0)) == [CompleteHook("ready", "CONTINUE")]
        assert a.step(seen("Warmed:Running", now=100, lifecycle="Warmed:Pending:Wait")) == []
        assert a.step(seen("Warmed:Running", now=120, lifecycle="Warmed:Pending:Wait")) == [
            CompleteHook("drain", "CONTINUE")
        ]
    assert a.step(seen("Warmed:Running", now=500, lifecycle="Warmed:Running")) == []

    assert a.step(seen("Terminated", now=1000, lifecycle="Warmed:Terminating:Wait")) == []
    assert a.step(seen("Terminated", now=1020, lifecycle="Warmed:Terminating:Wait")) == [
        CompleteHook("drain", "CONTINUE")
    ]
    assert a.step(seen("Terminated", now=1030, lifecycle="Warmed:Terminating:Wait")) == []


def test_a_dead_triton_in_service_is_reported_unhealthy_once() -> None:
    a = agent()
    a.step(seen(now=0))

    assert SetUnhealthy() not in a.step(seen(ready=False, now=10))
    assert SetUnhealthy() not in a.step(seen(ready=False, now=69))
    assert SetUnhealthy() in a.step(seen(ready=False, now=70))
    assert SetUnhealthy() not in a.step(seen(ready=False, now=200))


def test_an_unhealthy_mark_that_failed_is_sent_again_less_and_less_often() -> None:
    """SetInstanceHealth failed (throttled, the API unreachable): the mark was decided once and
    never sent again, and the host stayed in service with its dead Triton. It is sent again until
    it is taken, after 10 s, then twice as long after each failure, up to a minute: a persistent
    failure does not ask the API every round."""
    a = agent()
    a.step(seen(now=0))
    a.step(seen(ready=False, now=10))
    sent = []
    for now in range(70, 330, 10):
        for action in a.step(seen(ready=False, now=now)):
            sent.append(now)
            a.report(action, settled=now == 260, now=now)

    assert sent == [70, 80, 100, 140, 200, 260]


def test_an_unhealthy_mark_still_unsent_when_triton_recovers_is_dropped() -> None:
    """Sent after Triton came back, it would replace a host that recovered; a later outage is
    marked again after its own `unhealthy_after_s`."""
    a = agent()
    a.step(seen(now=0))
    a.step(seen(ready=False, now=10))
    assert a.step(seen(ready=False, now=70)) == [SetUnhealthy()]
    a.report(SetUnhealthy(), settled=False, now=70)

    assert a.step(seen(ready=True, now=75)) == []
    assert a.step(seen(ready=False, now=80)) == []
    assert a.step(seen(ready=False, now=139)) == []
    assert a.step(seen(ready=False, now=140)) == [SetUnhealthy()]


def test_a_short_blip_is_not_unhealthy() -> None:
    a = agent()
    a.step(seen(now=0))
    a.step(seen(ready=False, now=10))
    a.step(seen(ready=True, now=20))

    assert SetUnhealthy() not in a.step(seen(ready=False, now=75))


def test_a_host_with_streams_stays_a_scale_in_candidate() -> None:
    """The edge spreads streams over the least loaded hosts: with more streams than hosts, every
    host has some. Protected from scale-in while it had any, no host could be scaled in; the drain
    keeps their streams alive instead."""
    a = agent()
    a.step(seen(now=0))
    for now, streams in enumerate((0, 4, 9, 0), start=1):
        assert a.step(seen(streams=streams, now=now)) == []


def test_a_host_scaled_in_back_to_the_warm_pool_is_drained() -> None:
    """With reuse_on_scale_in the terminate hook returns the host to the warm pool: its target
    state is Warmed:Stopped, not Terminated. Its hook was left to the drain limit (300 s of GPU
    time every scale-in)."""
    a = agent()
    assert a.step(seen("Warmed:Stopped", now=0)) == [CompleteHook("ready", "CONTINUE")]  # into the pool
    # Launched from the pool: paused at Pending:Wait by the launch hook again.
    assert a.step(seen(now=10)) == [CompleteHook("ready", "CONTINUE")]
    assert a.step(seen(now=15)) == []
    assert a.step(seen("Warmed:Stopped", streams=2, now=20)) == []
    assert a.step(seen("Warmed:Stopped", streams=0, now=30)) == []  # the edges may still send some
    assert a.step(seen("Warmed:Stopped", streams=0, now=40)) == [CompleteHook("drain", "CONTINUE")]


def test_the_terminate_hook_completes_when_the_streams_end() -> None:
    a = agent()
    a.step(seen(now=0))

    assert a.step(seen("Terminated", streams=5, now=100)) == []
    assert a.step(seen("Terminated", streams=1, now=150)) == []
    assert a.step(seen("Terminated", streams=0, now=160)) == [CompleteHook("drain", "CONTINUE")]
    assert a.step(seen("Terminated", streams=0, now=170)) == []


def test_an_idle_host_waits_until_every_edge_has_stopped_sending_it_streams() -> None:
    """The edges re-read the group's in-service hosts every discovery interval (15 s): a hook
    completed the moment an idle host was taken out of service released it while they could still
    place new streams on it, which then met a stopping Triton."""
    a = agent()
    a.step(seen(now=0))
    assert a.step(seen("Terminated", streams=0, now=100)) == []
    assert a.step(seen("Terminated", streams=2, now=110)) == []  # one an edge placed meanwhile
    assert a.step(seen("Terminated", streams=0, now=119)) == []
    assert a.step(seen("Terminated", streams=0, now=120)) == [CompleteHook("drain", "CONTINUE")]


def test_the_terminate_hook_completes_at_the_drain_limit() -> None:
    a = agent()
    a.step(seen(now=0))
    a.step(seen("Terminated", streams=5, now=100))

    assert a.step(seen("Terminated", streams=5, now=400)) == [CompleteHook("drain", "CONTINUE")]


def test_metrics_text_gives_streams_and_gpu_datums() -> None:
    datums = gpu_datums(METRICS, [{"Name": "AutoScalingGroupName", "Value": "g"}], at=None)  # type: ignore[arg-type]

    assert active_requests(METRICS) == 3
    assert active_requests("") == 0
    assert {(d["MetricName"], d["Value"]) for d in datums} == {
        ("GPUUtilization", 0.97),
        ("GPUMemoryUsed", 4.2e10),
    }
    assert all({"Name": "Gpu", "Value": "GPU-abc"} in d["Dimensions"] for d in datums)


# -- the agent against the Auto Scaling API ------------------------------------------------------


@dataclass
class HostState:
    instance_id: str = ""
    target_state: str = "InService"
    ready: bool = True
    metrics: str = METRICS
    seen_paths: list[str] = field(default_factory=list)
    # Cleared: the metrics page answers only once it is set (a host too busy to answer in time).
    metrics_answer: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.metrics_answer.set()


@pytest.fixture
def host_endpoints() -> Iterator[tuple[str, HostState]]:
    """One loopback server answering as IMDSv2 (/latest/...) and as Triton (/v2/..., /metrics)."""
    state = HostState()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *_: Any) -> None:
            pass

        def _send(self, status: int, body: str) -> None:
            data = body.encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_PUT(self) -> None:
            self._send(200, "token") if self.path == "/latest/api/token" else self._send(404, "")

        def do_GET(self) -> None:
            state.seen_paths.append(self.path)
            if self.path == "/metrics":
                state.metrics_answer.wait()
            if (
                not self.path.startswith("/latest/")
                or self.headers.get("X-aws-ec2-metadata-token") == "token"
            ):
                answers = {
                    "/latest/meta-data/instance-id": (200, state.instance_id),
                    "/latest/meta-data/autoscaling/target-lifecycle-state": (200, state.target_state),
                    "/v2/health/ready": (200 if state.ready else 503, ""),
                    "/metrics": (200, state.metrics),
                }
                self._send(*answers.get(self.path, (404, "")))
            else:
                self._send(401, "")

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", state
    finally:
        state.metrics_answer.set()
        server.shutdown()
        server.server_close()


def _group_with_one_host(endpoint: str, name: str) -> str:
    """A group of one host (in service: moto has no lifecycle hooks) and that host's instance id."""
    ec2, autoscaling = aws_client("ec2", endpoint), aws_client("autoscaling", endpoint)
    template = ec2.create_launch_template(
        LaunchTemplateName=name,
        LaunchTemplateData={"ImageId": "ami-12c6146b", "InstanceType": "g6e.xlarge"},
    )["LaunchTemplate"]["LaunchTemplateId"]
    autoscaling.create_auto_scaling_group(
        AutoScalingGroupName=name,
        LaunchTemplate={"LaunchTemplateId": template, "Version": "$Latest"},
        MinSize=1,
        MaxSize=1,
        AvailabilityZones=["us-east-1a"],
    )
    (instance,) = autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[name])["AutoScalingGroups"][
        0
    ]["Instances"]
    instance_id: str = instance["InstanceId"]
    return instance_id


def test_the_agent_reports_and_completes_on_the_real_api(
    moto_endpoint: str,  # noqa: F811 (fixture)
    host_endpoints: tuple[str, HostState],
) -> None:
    base, state = host_endpoints
    autoscaling = aws_client("autoscaling", moto_endpoint)
    state.instance_id = _group_with_one_host(moto_endpoint, "agent-test")
    agents_autoscaling, called = aws_client("autoscaling", moto_endpoint), set[str]()
    agents_autoscaling.meta.events.register(
        "before-call.autoscaling", lambda model, **_: called.add(f"autoscaling:{model.name}")
    )
    host = _host("agent-test", base, agents_autoscaling, moto_endpoint)
    a = agent()

    def round_at(now: float) -> list[Any]:
        observation, text = host.observe(now)
        actions = a.step(observation)
        for action in actions:
            host.act(action)
        host.ship_gpu_metrics(text)
        return actions

    def described() -> dict[str, Any]:
        answer = autoscaling.describe_auto_scaling_instances(InstanceIds=[state.instance_id])
        instance: dict[str, Any] = answer["AutoScalingInstances"][0]
        return instance

    assert round_at(0) == []  # in service (moto has no lifecycle hooks): no launch hook to complete
    host.act(CompleteHook("ready", "CONTINUE"))  # none pending: the API's refusal is logged, not raised
    assert round_at(1) == []  # 3 active streams: still a scale-in candidate (the drain keeps them)
    assert described()["ProtectedFromScaleIn"] is False
    state.ready = False
    round_at(3)
    assert round_at(70) == [SetUnhealthy()]
    assert described()["HealthStatus"].upper() == "UNHEALTHY"
    metrics = aws_client("cloudwatch", moto_endpoint).list_metrics(Namespace="Floodgate/GPU")["Metrics"]
    assert {m["MetricName"] for m in metrics} >= {"GPUUtilization", "GPUMemoryUsed"}
    # Each Auto Scaling call the agent made is one the hosts' role allows (gpu_pool's iam.tf).
    policy = module(MODULES / "gpu_pool").data("aws_iam_policy_document")["gpu"]["statement"]
    assert called <= {action for statement in policy for action in statement["actions"]}


def test_an_agent_restarted_on_a_host_in_service_marks_a_dead_triton_unhealthy(
    moto_endpoint: str,  # noqa: F811 (fixture)
    host_endpoints: tuple[str, HostState],
) -> None:
    """A fresh agent (what a restart leaves) on a host the group has in service, Triton not back:
    Unhealthy after `unhealthy_after_s`, and no launch hook completed, none being pending."""
    base, state = host_endpoints
    autoscaling = aws_client("autoscaling", moto_endpoint)
    state.instance_id = _group_with_one_host(moto_endpoint, "agent-restart")
    state.ready = False
    host, a = _host("agent-restart", base, autoscaling, moto_endpoint), agent()

    assert take_round(a, host, 0) == []
    assert take_round(a, host, 60) == [SetUnhealthy()]
    answer = autoscaling.describe_auto_scaling_instances(InstanceIds=[state.instance_id])
    assert answer["AutoScalingInstances"][0]["HealthStatus"].upper() == "UNHEALTHY"


def test_an_unhealthy_mark_the_api_refused_for_a_moment_is_sent_again(
    moto_endpoint: str,  # noqa: F811 (fixture)
    host_endpoints: tuple[str, HostState],
) -> None:
    """Triton dead in service, and the Auto Scaling API throttles the agent's SetInstanceHealth
    (the account's request rate, shared with every host and the edges' discovery). The mark was
    never sent again: the host kept its dead Triton in service for good."""
    base, state = host_endpoints
    state.instance_id = _group_with_one_host(moto_endpoint, "agent-throttled")
    state.ready = False
    with refusing_autoscaling(moto_endpoint) as api:
        api.refuse("SetInstanceHealth", "Throttling", times=2)
        host, a = _host("agent-throttled", base, aws_client("autoscaling", api.url), moto_endpoint), agent()
        for now in range(0, 100, 10):
            take_round(a, host, now)

        assert api.calls.count("SetInstanceHealth") == 3  # at 60, 70 and 90 s (the second refusal: 20 s)
    answer = aws_client("autoscaling", moto_endpoint).describe_auto_scaling_instances(
        InstanceIds=[state.instance_id]
    )
    assert answer["AutoScalingInstances"][0]["HealthStatus"].upper() == "UNHEALTHY"


def test_an_unhealthy_mark_refused_for_good_is_not_sent_again(
    moto_endpoint: str,  # noqa: F811 (fixture)
    host_endpoints: tuple[str, HostState],
) -> None:
    """A ValidationError (the host no longer in the group) is the same however often it is asked:
    the mark is sent once, the refusal a warning."""
    base, state = host_endpoints
    state.instance_id = _group_with_one_host(moto_endpoint, "agent-refused")
    state.ready = False
    with refusing_autoscaling(moto_endpoint) as api, capture_logs() as logs:
        api.refuse("SetInstanceHealth", "ValidationError", times=100)
        host, a = _host("agent-refused", base, aws_client("autoscaling", api.url), moto_endpoint), agent()
        for now in range(0, 600, 10):
            take_round(a, host, now)

        assert api.calls.count("SetInstanceHealth") == 1
    (failed,) = [line for line in logs if line["event"] == "host_agent_action_failed"]
    assert (failed["log_level"], failed["retried"]) == ("warning", False)


def test_an_unhealthy_mark_denied_until_the_role_s_policy_takes_effect_is_sent_again(
    moto_endpoint: str,  # noqa: F811 (fixture)
    host_endpoints: tuple[str, HostState],
) -> None:
    """IAM is eventually consistent: a role or policy just created or changed (the same apply as the
    group, an edit of the host policy) is refused with AccessDenied for a while, then allowed. The
    mark was given up at its first AccessDenied, and the host kept its dead Triton in service for
    good: the agent marks once per outage, so neither the policy taking effect nor an operator's
    fix of it ever got the mark sent. It is sent again as a throttled one is, each refusal an
    error an operator sees."""
    base, state = host_endpoints
    state.instance_id = _group_with_one_host(moto_endpoint, "agent-denied")
    state.ready = False
    with refusing_autoscaling(moto_endpoint) as api, capture_logs() as logs:
        api.refuse("SetInstanceHealth", "AccessDenied", times=2)
        host, a = _host("agent-denied", base, aws_client("autoscaling", api.url), moto_endpoint), agent()
        for now in range(0, 100, 10):
            take_round(a, host, now)

        assert api.calls.count("SetInstanceHealth") == 3  # at 60, 70 and 90 s
    failed = [
        (line["log_level"], line["retried"]) for line in logs if line["event"] == "host_agent_action_failed"
    ]
    assert failed == [("error", True), ("error", True)]
    answer = aws_client("autoscaling", moto_endpoint).describe_auto_scaling_instances(
        InstanceIds=[state.instance_id]
    )
    assert answer["AutoScalingInstances"][0]["HealthStatus"].upper() == "UNHEALTHY"


def test_an_unhealthy_mark_the_api_keeps_refusing_is_an_error_and_still_sent(
    moto_endpoint: str,  # noqa: F811 (fixture)
    host_endpoints: tuple[str, HostState],
) -> None:
    """Throttled for minutes, the mark is still sent once a minute (given up, the host would keep
    its dead Triton in service for good), and from the fifth failure each one is an error an alarm
    can watch: it was only ever a warning, the same as a single throttled call."""
    base, state = host_endpoints
    state.instance_id = _group_with_one_host(moto_endpoint, "agent-stuck")
    state.ready = False
    with refusing_autoscaling(moto_endpoint) as api, capture_logs() as logs:
        api.refuse("SetInstanceHealth", "Throttling", times=6)
        host, a = _host("agent-stuck", base, aws_client("autoscaling", api.url), moto_endpoint), agent()
        for now in range(0, 330, 10):
            take_round(a, host, now)

        # At 60, 70, 90, 130, 190, 250 (refused) and 310 s (taken).
        assert api.calls.count("SetInstanceHealth") == 7
    stuck = [
        (line["log_level"], line["failures"]) for line in logs if line["event"] == "host_agent_action_stuck"
    ]
    assert stuck == [("error", 5), ("error", 6)]
    answer = aws_client("autoscaling", moto_endpoint).describe_auto_scaling_instances(
        InstanceIds=[state.instance_id]
    )
    assert answer["AutoScalingInstances"][0]["HealthStatus"].upper() == "UNHEALTHY"


def test_an_agent_restarted_in_a_running_warm_pool_reads_the_move_into_service_from_the_api(
    moto_endpoint: str,  # noqa: F811 (fixture)
    host_endpoints: tuple[str, HostState],
) -> None:
    """The agent kept the API's first answer (Warmed:Running) for good: when the group moved the
    host into service, paused at Pending:Wait, it read nothing new, took the host for one in service
    and left the launch hook to time out (ABANDON). It reads the state again when the target state
    changes, and only then."""
    base, state = host_endpoints
    state.instance_id = _group_with_one_host(moto_endpoint, "agent-pool")
    state.target_state = "Warmed:Running"
    with refusing_autoscaling(moto_endpoint) as api:
        api.describe_as("Warmed:Running")
        host, a = _host("agent-pool", base, aws_client("autoscaling", api.url), moto_endpoint), agent()
        assert [action for now in range(0, 100, 10) for action in take_round(a, host, now)] == []

        api.describe_as("Pending:Wait")
        state.target_state = "InService"
        assert take_round(a, host, 100) == [CompleteHook("ready", "CONTINUE")]
        assert [action for now in range(110, 200, 10) for action in take_round(a, host, now)] == []

        assert api.completed == ["CONTINUE"]
        assert api.calls.count("DescribeAutoScalingInstances") == 2


def test_a_lifecycle_state_the_api_throttles_is_asked_less_and_less_often(
    moto_endpoint: str,  # noqa: F811 (fixture)
    host_endpoints: tuple[str, HostState],
) -> None:
    """The agent reads its lifecycle state each time its target state changes, and a scale-in or a
    scale-out changes it on many hosts at once: throttled, each asked again every round, hundreds
    of hosts kept the account's Describe rate spent, the edges' discovery with it. A read that
    failed is asked again as a failed action is sent again, less and less often, and is taken once
    the API answers."""
    base, state = host_endpoints
    state.instance_id = _group_with_one_host(moto_endpoint, "agent-describe-throttled")
    with refusing_autoscaling(moto_endpoint) as api:
        api.refuse("DescribeAutoScalingInstances", "Throttling", times=7)
        group = "agent-describe-throttled"
        host, a = _host(group, base, aws_client("autoscaling", api.url), moto_endpoint), agent()
        for now in range(0, 310, 10):
            take_round(a, host, now)

        # At 0, 10, 30, 70, 130, 190 and 250 s (refused), and 310 s (answered).
        assert api.calls.count("DescribeAutoScalingInstances") == 7
        assert host.observe(310)[0].lifecycle_state == "InService"
        assert host.observe(320)[0].lifecycle_state == "InService"
        assert api.calls.count("DescribeAutoScalingInstances") == 8


@pytest.mark.parametrize("paused_by", ["ready", "drain"])
def test_an_agent_restarted_on_its_way_into_the_warm_pool_completes_the_hook_that_pauses_it(
    moto_endpoint: str,  # noqa: F811 (fixture)
    host_endpoints: tuple[str, HostState],
    paused_by: str,
) -> None:
    """The API reads Warmed:Pending:Wait for a launch into the warm pool (the launch hook pauses the
    host) and for a scale-in back to it (the terminate hook). The restarted agent completed the
    launch hook only: on a scale-in AWS refused it, and the terminate hook held the host for its
    whole heartbeat. The hook that pauses the host is completed, once; the other's completion is
    refused and not sent again."""
    base, state = host_endpoints
    group = f"agent-into-pool-{paused_by}"
    state.instance_id = _group_with_one_host(moto_endpoint, group)
    state.target_state, state.metrics = "Warmed:Stopped", ""  # Triton ready, no stream
    with refusing_autoscaling(moto_endpoint) as api:
        api.describe_as("Warmed:Pending:Wait")
        api.pause_at(f"{group}-{paused_by}")
        host, a = _host(group, base, aws_client("autoscaling", api.url), moto_endpoint), agent()
        for now in range(0, 200, 10):
            take_round(a, host, now)

        assert api.completed == ["CONTINUE"]
        assert api.calls.count("CompleteLifecycleAction") == 2


def _launching_host(base: str, api_url: str, moto_url: str) -> AwsHost:
    """A host the group does not describe (moto has no lifecycle hooks): the agent acts as on a
    fresh launch, its launch hook pending."""
    return _host("agent-launch", base, aws_client("autoscaling", api_url), moto_url)


def _host(group: str, base: str, autoscaling: Any, moto_url: str) -> AwsHost:
    """The agent's view of a host of `group` (its hooks GROUP-ready and GROUP-drain), its instance
    metadata and Triton at `base`, its Auto Scaling calls through `autoscaling`, CloudWatch moto's."""
    return AwsHost(
        group,
        {"ready": f"{group}-ready", "drain": f"{group}-drain"},
        "Floodgate/GPU",
        autoscaling,
        aws_client("cloudwatch", moto_url),
        imds=f"{base}/latest",
        triton_http=base,
        triton_metrics=f"{base}/metrics",
    )


def test_a_launch_hook_the_api_throttled_is_completed_in_a_later_round(
    moto_endpoint: str,  # noqa: F811 (fixture)
    host_endpoints: tuple[str, HostState],
) -> None:
    """Triton ready, and CompleteLifecycleAction throttled: the failure was logged as a hook no
    longer pending and never sent again. The hook then timed out with its default result, ABANDON
    (gpu_pool's initial_lifecycle_hook), and the group threw away a host whose engine was loaded."""
    base, state = host_endpoints
    state.instance_id = "i-0launching0000001"
    with refusing_autoscaling(moto_endpoint) as api:
        api.refuse("CompleteLifecycleAction", "Throttling")
        host, a = _launching_host(base, api.url, moto_endpoint), agent()

        assert take_round(a, host, 0) == [CompleteHook("ready", "CONTINUE")]
        assert api.completed == []
        assert take_round(a, host, 10) == [CompleteHook("ready", "CONTINUE")]
        assert api.completed == ["CONTINUE"]
        for now in range(20, 120, 10):
            assert take_round(a, host, now) == []
        assert api.calls.count("CompleteLifecycleAction") == 2


def test_a_launch_hook_denied_until_the_role_s_policy_takes_effect_is_completed_later(
    moto_endpoint: str,  # noqa: F811 (fixture)
    host_endpoints: tuple[str, HostState],
) -> None:
    """An AccessDenied at the host's first minutes (the role's policy not yet in effect everywhere)
    gave the CONTINUE up: the hook then timed out with ABANDON and the group threw away a host
    whose engine was loaded. It is sent again until taken."""
    base, state = host_endpoints
    state.instance_id = "i-0launching0000003"
    with refusing_autoscaling(moto_endpoint) as api:
        api.refuse("CompleteLifecycleAction", "AccessDenied")
        host, a = _launching_host(base, api.url, moto_endpoint), agent()

        assert take_round(a, host, 0) == [CompleteHook("ready", "CONTINUE")]
        assert take_round(a, host, 10) == [CompleteHook("ready", "CONTINUE")]
        assert [action for now in range(20, 120, 10) for action in take_round(a, host, now)] == []
        assert api.completed == ["CONTINUE"]


@pytest.mark.parametrize("hook", ["ready", "drain"])
def test_a_hook_completion_retried_and_decided_anew_goes_out_once_a_round(
    moto_endpoint: str,  # noqa: F811 (fixture)
    host_endpoints: tuple[str, HostState],
    hook: Literal["ready", "drain"],
) -> None:
    """A warm pool kept running keeps the agent running with its host. A hook's CONTINUE that
    failed on the way into the pool (its answer lost, AWS having taken it: the host moved on) is
    still to be sent again when the host moves, and the move decides the same CONTINUE anew: the
    launch's on a move into service, the drain's on a termination from the pool. Both went out in
    the same round, and the one failure counted twice."""
    base, state = host_endpoints
    group = f"agent-twice-{hook}"
    state.instance_id, state.metrics = _group_with_one_host(moto_endpoint, group), ""  # no stream
    with refusing_autoscaling(moto_endpoint) as api:
        host, a = _host(group, base, aws_client("autoscaling", api.url), moto_endpoint), agent()
        if hook == "ready":  # launched into the pool; the CONTINUE fails once, due again at 10 s
            state.target_state = "Warmed:Running"
            api.describe_as("Warmed:Pending:Wait")
            api.refuse("CompleteLifecycleAction", "Throttling")
            assert take_round(a, host, 0) == [CompleteHook("ready", "CONTINUE")]
            state.target_state, moved_at, both_due_at = "InService", 10, 10
            api.describe_as("Pending:Wait")
        else:  # scaled in to the pool; the CONTINUE fails at 120 and 130 s, due again at 150 s
            assert take_round(a, host, 0) == []  # in service
            state.target_state = "Warmed:Running"
            api.describe_as("Warmed:Pending:Wait")
            api.refuse("CompleteLifecycleAction", "Throttling", times=2)
            assert take_round(a, host, 100) == []
            assert take_round(a, host, 120) == [CompleteHook("drain", "CONTINUE")]
            state.target_state, moved_at, both_due_at = "Terminated", 130, 150  # a drain from 130 s
            api.describe_as("Warmed:Terminating:Wait")
        for now in range(moved_at, both_due_at, 10):
            take_round(a, host, now)
        calls_before = api.calls.count("CompleteLifecycleAction")

        assert take_round(a, host, both_due_at) == [CompleteHook(hook, "CONTINUE")]
        assert api.calls.count("CompleteLifecycleAction") == calls_before + 1
        assert a.retries == {}
        assert [
            action for now in range(both_due_at + 10, 300, 10) for action in take_round(a, host, now)
        ] == []


def test_a_launch_hook_no_longer_pending_is_not_sent_again(
    moto_endpoint: str,  # noqa: F811 (fixture)
    host_endpoints: tuple[str, HostState],
) -> None:
    """The API's ValidationError (no lifecycle action pending: completed already, timed out) is
    final: the agent neither sends the action again nor stops, and drains the host later."""
    base, state = host_endpoints
    state.instance_id = "i-0launching0000002"
    with refusing_autoscaling(moto_endpoint) as api:
        api.refuse("CompleteLifecycleAction", "ValidationError")
        host, a = _launching_host(base, api.url, moto_endpoint), agent()

        assert take_round(a, host, 0) == [CompleteHook("ready", "CONTINUE")]
        assert [action for now in range(10, 130, 10) for action in take_round(a, host, now)] == []
        state.target_state, state.metrics = "Terminated", ""  # scaled in, no stream left
        sent = [action for now in range(130, 160, 10) for action in take_round(a, host, now)]

        assert sent == [CompleteHook("drain", "CONTINUE")]
        assert api.calls.count("CompleteLifecycleAction") == 2
        assert api.completed == ["CONTINUE"]  # the drain's


def _draining_host(base: str, metrics: str, timeout_s: float) -> tuple[AwsHost, HostAgent]:
    host = AwsHost(
        "g",
        {"ready": "g-ready", "drain": "g-drain"},
        "ns",
        None,
        None,
        imds=f"{base}/latest",
        triton_http=base,
        triton_metrics=metrics,
        metrics_timeout_s=timeout_s,
    )
    return host, HostAgent(
        ready_timeout_s=600,
        drain_s=300,
        unhealthy_after_s=60,
        started_at=0,
        launch_done=True,
        in_service=True,
    )


def test_a_drain_whose_streams_cannot_be_counted_waits_for_its_limit(
    host_endpoints: tuple[str, HostState],
) -> None:
    """A host taken out of service whose metrics page answers later than the agent waits (a busy
    GPU host): its streams were counted as none, and the hook completed after the 20 s every edge
    needs to stop sending, cutting the streams still running instead of waiting for them."""
    base, state = host_endpoints
    state.target_state = "Terminated"
    state.metrics_answer.clear()
    host, agent = _draining_host(base, f"{base}/metrics", timeout_s=0.2)
    for now in (0, 10, 20, 30, 299):
        observation, _ = host.observe(now)
        assert observation.active_streams is None
        assert agent.step(observation) == [], now
    assert agent.step(host.observe(300)[0]) == [CompleteHook("drain", "CONTINUE")]


def test_a_drain_with_triton_gone_completes_once_the_edges_stopped_sending(
    host_endpoints: tuple[str, HostState],
) -> None:
    """Nothing listens on the metrics port: Triton has exited and no stream survives it."""
    base, state = host_endpoints
    state.target_state = "Terminated"
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{unused.getsockname()[1]}/metrics"  # bound, never listening
        host, agent = _draining_host(base, closed, timeout_s=2.0)
        assert host.observe(0)[0].active_streams == 0
        assert agent.step(host.observe(0)[0]) == []
        assert agent.step(host.observe(20)[0]) == [CompleteHook("drain", "CONTINUE")]


def test_a_silent_cloudwatch_holds_a_round_for_one_bounded_call(
    moto_endpoint: str,  # noqa: F811 (fixture)
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """CloudWatch gone silent (a black-holed path: connections accepted, nothing answered). Every
    round ships the GPU metrics after its decisions, and the next round (a drain's terminate hook,
    an Unhealthy mark, the launch's hook) waits for that call: the agent's own clients give it up
    within seconds, not botocore's defaults (60 s a reply, 5 tries: minutes of a host neither
    drained nor replaced)."""
    bound_s = 15.0  # two short tries, with room for a busy host
    with stalling_proxy(int(moto_endpoint.rsplit(":", 1)[1])) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL_CLOUDWATCH", f"http://127.0.0.1:{proxy.port}")
        monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
        autoscaling, cloudwatch = aws_clients()
        host = AwsHost("g", {"ready": "g-ready", "drain": "g-drain"}, "ns", autoscaling, cloudwatch)
        proxy.black_hole()
        failed: list[BaseException] = []

        def ship() -> None:
            try:
                host.ship_gpu_metrics(METRICS)
            except Exception as exc:  # what the round logs, then the next round begins
                failed.append(exc)

        shipping = threading.Thread(target=ship, daemon=True)
        shipping.start()
        try:
            shipping.join(bound_s)
            held = shipping.is_alive()
        finally:
            proxy.close()  # what is still out meets a closed connection and ends
            shipping.join(60)
        assert not held, f"a round was still held by a silent CloudWatch after {bound_s} s"
        assert failed  # the call out gave up
