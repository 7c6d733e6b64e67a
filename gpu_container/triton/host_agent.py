"""The GPU host's agent: tells its Auto Scaling group what only the host knows about Triton.

    python3 -m gpu_container.triton.host_agent --group G --ready-hook H --drain-hook D \
        --ready-timeout-s 1740 --drain-s 600 --metric-namespace Floodgate/GPU

It runs beside Triton on every GPU host (iac/modules/gpu_pool/user_data.sh.tftpl starts it from the
same image, host networking) and, every `--interval-s`:

* launch: once Triton answers ready, completes the launch lifecycle hook (CONTINUE), so the host
  joins the group only with its engine loaded, on first boot and when it leaves the warm pool; if
  Triton is not ready within `--ready-timeout-s`, abandons the launch at once (ABANDON) so the
  group replaces the host instead of waiting out the hook. An agent restarted on a host past its
  launch (a reboot, a crashed container) has no hook to complete: the metadata's target state reads
  InService both while the hook waits and in service, so the agent asks the Auto Scaling API
  (DescribeAutoScalingInstances: Pending:Wait or InService) and goes straight to its health watch.
  It asks again each time the target state changes, and only then: a host in a warm pool kept
  running (Warmed:Running) that the group moves into service pauses at Pending:Wait for the launch
  hook again, and the agent completes it as on a first launch;
* health: in service, Triton not ready for `--unhealthy-after-s` marks the host Unhealthy (the
  group replaces it; EC2 status checks alone never see a dead Triton on a healthy instance);
* drain: when the group takes the host out of service (target state Terminated, or back to the warm
  pool: Warmed:*, as reuse_on_scale_in returns scaled-in hosts there), completes the terminate hook
  once the host has no stream and every edge has stopped placing new ones on it, at the latest after
  `--drain-s` (a host terminated from a warm pool kept running is drained anew: its drain on the
  way into the pool was another hook's). The edges find the group's in-service hosts again every
  `[upstream] discovery_interval_s` (15 s): until each has, it may still send this host new streams, so the
  hook waits `--min-drain-s` (20 s) from the first sight of the drain even on an idle host (it
  completed at once before, and the streams the edges sent next met a stopping Triton). The drain
  is what keeps streams alive through a scale-in. The agent used to protect every host with a
  stream from scale-in besides: the edge spreads streams over the least loaded hosts, so with more
  streams than hosts every host was protected and the group could not scale in until traffic all
  but stopped, however far the demand fell. Streams it cannot count (the metrics page slower than
  its timeout on a busy host) are not none: the hook then waits for `--drain-s`; with nothing
  listening on the metrics port (Triton gone, its streams with it) it waits only `--min-drain-s`.
  An agent restarted on a host paused on its way into the warm pool cannot tell a launch into it
  from a scale-in back to it: it completes both hooks as each would be, AWS takes the one pending;
* GPU metrics: Triton's nv_gpu_* gauges go to CloudWatch (`--metric-namespace`) per GPU.

The decisions (`HostAgent.step`) are pure: an observation in, actions out, and what became of each
(`HostAgent.report`) back in: an action that failed for a reason that may pass is sent again, less
and less often. `AwsHost` carries them out through the instance metadata service and the Auto
Scaling API.
"""

from __future__ import annotations

import argparse
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

import structlog

from gpu_container.plain_logging import configure_plain_logging
from gpu_container.triton.trtllm_metrics import active_requests, parse_samples

log = structlog.get_logger(__name__)

IMDS = "http://169.254.169.254/latest"
TRITON_HTTP = "http://127.0.0.1:8000"
TRITON_METRICS = "http://127.0.0.1:8002/metrics"
GPU_GAUGES = {
    "nv_gpu_utilization": ("GPUUtilization", "None"),
    "nv_gpu_memory_used_bytes": ("GPUMemoryUsed", "Bytes"),
    "nv_gpu_memory_total_bytes": ("GPUMemoryTotal", "Bytes"),
    "nv_gpu_power_usage": ("GPUPowerWatts", "None"),
}
# The Auto Scaling API's lifecycle states in which a launch hook is pending or yet to come (the hook
# pauses a launch at Pending:Wait, or Warmed:Pending:Wait on its way into the warm pool).
LAUNCHING = frozenset({"Pending", "Pending:Wait", "Warmed:Pending", "Warmed:Pending:Wait"})
# The states of a host on its way into the warm pool: launched into it (the launch hook pauses it)
# or scaled in back to it (reuse_on_scale_in: the terminate hook pauses it, in the same state).
ENTERING_POOL = frozenset({"Warmed:Pending", "Warmed:Pending:Wait"})
# An action that failed is sent again after RETRY_S, then twice as long after each failure, up to
# RETRY_MAX_S: a throttled or unreachable API is not asked every round by every host.
RETRY_S = 10.0
RETRY_MAX_S = 60.0
# From this many failures of one action on, each further failure is logged as an error
# (host_agent_action_stuck): about 3 minutes of refusals, past any burst of throttling.
STUCK_AFTER = 5
# The error codes of a refusal that may pass (botocore's standard retry mode's throttling and
# transient errors, and Auto Scaling's ResourceContention): a warning. Any other refusal but a
# ValidationError (AccessDenied) is an error an operator must see, and is still sent again.
MAY_PASS = frozenset(
    {
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottledException",
        "TooManyRequestsException",
        "RequestLimitExceeded",
        "RequestThrottled",
        "SlowDown",
        "EC2ThrottledException",
        "LimitExceededException",
        "PriorRequestNotComplete",
        "RequestTimeout",
        "RequestTimeoutException",
        "InternalError",
        "InternalFailure",
        "ServiceUnavailable",
        "ResourceContention",
        # The instance profile's credentials expired before botocore fetched the next ones.
        "ExpiredToken",
        "ExpiredTokenException",
        "RequestExpired",
    }
)


@dataclass(frozen=True, slots=True)
class Observation:
    target_state: str  # the instance metadata's autoscaling/target-lifecycle-state
    ready: bool  # Triton's /v2/health/ready
    # TensorRT-LLM's active requests; 0 when nothing listens on the metrics port (Triton is gone,
    # and its streams with it), None when it did not answer in time (a busy host: unknown, so a
    # drain waits for `drain_s` rather than cut the streams it could not count).
    active_streams: int | None
    now: float
    # The Auto Scaling API's LifecycleState for this host, read since `target_state` last changed
    # (asked until the API answers); None before it has: the agent then acts on what it saw.
    lifecycle_state: str | None = None


@dataclass(frozen=True, slots=True)
class CompleteHook:
    hook: Literal["ready", "drain"]
    result: Literal["CONTINUE", "ABANDON"]


@dataclass(frozen=True, slots=True)
class SetUnhealthy:
    pass


Action = CompleteHook | SetUnhealthy


@dataclass
class HostAgent:
    ready_timeout_s: float
    drain_s: float
    unhealthy_after_s: float
    started_at: float
    launch_done: bool = False
    # Seen in service: a later Warmed:* target is a scale-in back to the warm pool, not a launch.
    in_service: bool = False
    # Restarted on its way into the warm pool, not knowing which hook pauses it: runs both.
    entering_pool: bool = False
    unready_since: float | None = None
    reported_unhealthy: bool = False
    drain_started: float | None = None
    drain_done: bool = False
    # How long the edges may still send new streams after the drain starts (their discovery
    # interval and a margin): an idle host's hook waits this long too.
    min_drain_s: float = 20.0
    # The actions AwsHost reported failed: how often, and when to send each again.
    retries: dict[Action, tuple[int, float]] = field(default_factory=dict)
    # The target state of the last observation, and whether the API's reading since it changed has
    # been taken in.
    target: str | None = None
    placed: bool = False

    def step(self, seen: Observation) -> list[Action]:
        """The actions this observation calls for: each decided once, and sent again while `report`
        says it failed. An action decided once and lost to a failed call was lost for good: a mark
        throttled once left a host with a dead Triton in service.

        Each action at most once a round: one still failing from before the host moved (a launch
        hook's CONTINUE from its launch into a warm pool kept running, a drain's from its way into
        it) is decided anew after the move, and the retry and the new decision both went out, the
        hook completed twice in one round and its one failure reported twice (backoff and stuck
        count doubled)."""
        decided = self._decide(seen)  # first: it drops retries that no longer apply
        due = [action for action, (_, at) in self.retries.items() if at <= seen.now]
        return due + [action for action in decided if action not in due]

    def report(self, action: Action, settled: bool, now: float) -> None:
        """What became of an action `step` returned: settled (taken, or refused for good), or failed
        for a reason that may pass, and sent again after a backoff.

        Such an action is sent again for as long as it applies (a mark: until Triton is back), once
        a minute at most, and never given up after some number of tries: a mark given up left a
        host with a dead Triton in service for good, a GPU paid for and a place in the group
        serving nothing, where a call a minute costs nothing against the account's request rate.
        What an operator needs is to know: from the STUCK_AFTER-th failure on, each one is logged
        as an error (`take_round`), which an alarm can watch."""
        if settled:
            self.retries.pop(action, None)
            return
        failures = self.retries[action][0] + 1 if action in self.retries else 1
        self.retries[action] = (failures, now + min(RETRY_S * 2 ** (failures - 1), RETRY_MAX_S))

    def _decide(self, seen: Observation) -> list[Action]:
        if seen.target_state != self.target:
            if (
                self.target is not None
                and self.target.startswith("Warmed:")
                and seen.target_state == "InService"
            ):
                self._leave_pool(seen.now)
            if (
                self.target is not None
                and self.target.startswith("Warmed:")
                and seen.target_state == "Terminated"
            ):
                self._terminate_from_pool()
            self.target, self.placed = seen.target_state, False
        if not self.placed and seen.lifecycle_state is not None:
            self._resume(seen.lifecycle_state, seen.target_state)
            self.placed = True
        state = seen.target_state
        if state == "Terminated" or (self.in_service and state.startswith("Warmed:")):
            return self._drain(seen)
        if self.entering_pool and state.startswith("Warmed:"):
            return ([] if self.launch_done else self._launch(seen)) + self._drain(seen)
        if not self.launch_done:
            return self._launch(seen)
        if state != "InService":
            return []
        self.in_service = True
        return self._health(seen)

    def _leave_pool(self, now: float) -> None:
        """The group moves the host from a warm pool it kept running (or hibernated, its agent
        with it) into service: its launch hook pauses it at Pending:Wait again, for the agent to
        complete once Triton answers. The agent took it for a host long launched and only watched
        its health: the hook timed out with its default result, ABANDON, and the group threw the
        host away. Its last drain, mark and outage belong to its time before the pool."""
        self.launch_done = self.in_service = self.drain_done = self.reported_unhealthy = False
        self.entering_pool = False
        self.started_at, self.drain_started, self.unready_since = now, None, None
        self.retries.pop(SetUnhealthy(), None)

    def _terminate_from_pool(self) -> None:
        """The group terminates the host from a warm pool it kept running (the pool shrunk, an
        instance refresh): the terminate hook pauses it again. The drain on its way into the pool
        (a scale-in's, or the one run beside a launch into it) is not this one: taken for done, it
        left this hook to its heartbeat (`scale_in_drain_s`), a running GPU held for nothing."""
        self.drain_done, self.drain_started = False, None

    def _resume(self, lifecycle_state: str, target_state: str) -> None:
        """The API's reading, taken in once per target state (it only changes with it). An agent
        started on a host past its launch (restarted: the host rebooted, its container crashed) has
        no launch hook to complete. Taken for a fresh launch, a host whose Triton did not come back
        waited out `ready_timeout_s` (29 minutes) before its health watch began."""
        # A warm pool's state under an InService target: the API has not caught up with the move
        # into service, whose launch hook is to come.
        leaving_pool = target_state == "InService" and lifecycle_state.startswith("Warmed:")
        if lifecycle_state in ENTERING_POOL and target_state.startswith("Warmed:") and not self.in_service:
            self._enter_pool()
        if lifecycle_state not in LAUNCHING and not leaving_pool:
            self.launch_done = True
            # In service or leaving it (not in the warm pool): a Warmed:* target is a scale-in.
            self.in_service = not lifecycle_state.startswith("Warmed:")

    def _enter_pool(self) -> None:
        """Restarted on a host paused on its way into the warm pool, the agent cannot tell which hook
        pauses it: the launch hook (a launch into the pool) and the terminate hook (a scale-in back
        to it) both pause it at Warmed:Pending:Wait, with the same target state, and an agent that
        never saw the host in service does not know whether it was. It runs both, the launch
        (CONTINUE once Triton answers) and the drain (CONTINUE once idle past `min_drain_s`): AWS
        refuses the completion of a hook that is not pending with a ValidationError, final and
        harmless. Taken for a launch, a host scaled in had its terminate hook left pending, the
        launch's CONTINUE refused, and was held for the drain's whole heartbeat (`scale_in_drain_s`,
        10 minutes of a GPU) before the group moved it on."""
        self.entering_pool = True

    def _launch(self, seen: Observation) -> list[Action]:
        if seen.target_state != "InService" and not seen.target_state.startswith("Warmed:"):
            return []
        if seen.ready:
            self.launch_done = True
            return [CompleteHook("ready", "CONTINUE")]
        if seen.now - self.started_at >= self.ready_timeout_s:
            self.launch_done = True
            return [CompleteHook("ready", "ABANDON")]
        return []

    def _health(self, seen: Observation) -> list[Action]:
        if seen.ready:
            self.unready_since = None
            # A mark still unsent would replace a host that recovered; a later outage marks anew.
            if self.retries.pop(SetUnhealthy(), None) is not None:
                self.reported_unhealthy = False
            return []
        if self.unready_since is None:
            self.unready_since = seen.now
        if not self.reported_unhealthy and seen.now - self.unready_since >= self.unhealthy_after_s:
            self.reported_unhealthy = True
            return [SetUnhealthy()]
        return []

    def _drain(self, seen: Observation) -> list[Action]:
        if self.drain_done:
            return []
        if self.drain_started is None:
            self.drain_started = seen.now
        draining_for = seen.now - self.drain_started
        idle = seen.active_streams == 0  # None, unknown, is not idle
        if (idle and draining_for >= self.min_drain_s) or draining_for >= self.drain_s:
            self.drain_done = True
            return [CompleteHook("drain", "CONTINUE")]
        return []


def gpu_datums(metrics_text: str, dimensions: list[dict[str, str]], at: datetime) -> list[dict[str, Any]]:
    """Triton's GPU gauges as CloudWatch datums, one per GPU (dimension Gpu = its UUID)."""
    datums = []
    for name, labels, value in parse_samples(metrics_text):
        if name in GPU_GAUGES:
            metric, unit = GPU_GAUGES[name]
            gpu = [{"Name": "Gpu", "Value": labels.get("gpu_uuid", "unknown")}]
            datums.append(
                {
                    "MetricName": metric,
                    "Dimensions": dimensions + gpu,
                    "Timestamp": at,
                    "Value": value,
                    "Unit": unit,
                }
            )
    return datums


def _get(url: str, timeout_s: float, headers: dict[str, str] | None = None) -> tuple[int, str]:
    """The status and body; 0 when nothing listens (the connection refused), -1 when no answer came
    in time or the connection broke."""
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, ""
    except urllib.error.URLError as exc:
        return (0 if isinstance(exc.reason, ConnectionRefusedError) else -1), ""
    except ConnectionRefusedError:
        return 0, ""
    except OSError:
        return -1, ""


def _error_code(exc: Exception) -> str | None:
    """The AWS error code of a botocore ClientError (None for any other failure), read without
    importing botocore: --help needs no AWS SDK."""
    response = getattr(exc, "response", None)
    return response.get("Error", {}).get("Code") if isinstance(response, dict) else None


def _may_pass(exc: Exception) -> bool:
    """Whether the failure is a passing one: no answer at all (unreachable, timed out), an AWS
    fault (5xx), or a refusal for the rate or a moment's contention."""
    response = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return True
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
    return status >= 500 or _error_code(exc) in MAY_PASS


class AwsHost:
    """This host's view of itself (IMDSv2, Triton on loopback) and its Auto Scaling calls."""

    def __init__(
        self,
        group: str,
        hooks: dict[str, str],
        metric_namespace: str,
        autoscaling: Any,
        cloudwatch: Any,
        *,
        imds: str = IMDS,
        triton_http: str = TRITON_HTTP,
        triton_metrics: str = TRITON_METRICS,
        metrics_timeout_s: float = 2.0,
    ) -> None:
        self.group = group
        self.hooks = hooks
        self.metric_namespace = metric_namespace
        self.autoscaling = autoscaling
        self.cloudwatch = cloudwatch
        self.imds = imds
        self.triton_http = triton_http
        self.triton_metrics = triton_metrics
        self.metrics_timeout_s = metrics_timeout_s
        self._instance_id: str | None = None
        # The target state the API was last answered at, and its answer.
        self._described: tuple[str, str | None] | None = None
        # The reads of the lifecycle state failed in a row, and when to ask again.
        self._describe_failures, self._describe_at = 0, float("-inf")

    def _metadata(self, path: str) -> str:
        token_request = urllib.request.Request(
            f"{self.imds}/api/token", method="PUT", headers={"X-aws-ec2-metadata-token-ttl-seconds": "300"}
        )
        with urllib.request.urlopen(token_request, timeout=2) as answer:
            token = answer.read().decode()
        status, body = _get(f"{self.imds}/meta-data/{path}", 2, {"X-aws-ec2-metadata-token": token})
        if status != 200:
            raise RuntimeError(f"instance metadata {path}: HTTP {status}")
        return body.strip()

    @property
    def instance_id(self) -> str:
        if self._instance_id is None:
            self._instance_id = self._metadata("instance-id")
        return self._instance_id

    def lifecycle_state(self, target: str, now: float) -> str | None:
        """This host's LifecycleState in its group, read again each time its target state changes
        (None until the API answers): the state can change only with it. One answer was kept for
        good: an agent restarted in a running warm pool read Warmed:Running, and took the host's
        later move into service (Pending:Wait) for a host long launched. Not read every round: a
        call every round from every host would spend the account's Describe rate the edges'
        discovery also draws on. A failed call is logged, not raised: the agent then acts on what it
        saw, as it can without the API. It is asked again after RETRY_S, then twice as long after
        each failure up to RETRY_MAX_S, as a failed action: a scale-in or scale-out changes the
        target state of many hosts at once, and each asking again every round while throttled kept
        the rate spent for all of them and for the edges."""
        if self._described is None or self._described[0] != target:
            if now < self._describe_at:
                return None
            try:
                answer = self.autoscaling.describe_auto_scaling_instances(InstanceIds=[self.instance_id])
                described = answer["AutoScalingInstances"]
                self._described = (target, described[0]["LifecycleState"] if described else None)
                self._describe_failures = 0
            except Exception as exc:
                self._describe_failures += 1
                self._describe_at = now + min(RETRY_S * 2 ** (self._describe_failures - 1), RETRY_MAX_S)
                log.warning("describe_auto_scaling_instances_failed", error=repr(exc))
                return None
        return self._described[1]

    def observe(self, now: float) -> tuple[Observation, str]:
        target = self._metadata("autoscaling/target-lifecycle-state")
        ready = _get(f"{self.triton_http}/v2/health/ready", 2)[0] == 200
        status, text = _get(self.triton_metrics, self.metrics_timeout_s)
        streams = active_requests(text) if status == 200 else 0 if status == 0 else None
        return Observation(target, ready, streams, now, self.lifecycle_state(target, now)), text

    def act(self, action: Action) -> bool:
        """Takes the action. Whether it is settled: only a ValidationError (no lifecycle action
        pending: completed already, or timed out; the instance no longer in a group) never will
        pass, and is a warning, as it is what a restarted agent meets. Any other failure is sent
        again: a passing one (throttled, an AWS fault, the API or the metadata service unreachable)
        as a warning, any other refusal (AccessDenied) as an error for an operator to act on. An
        AccessDenied is not final: IAM is eventually consistent, and a role or policy just created
        or changed is refused for a while; one given up left a host with a dead Triton in service
        for good (one mark an outage) or its launch hook to time out with ABANDON, and a policy
        fixed later changed nothing. A CONTINUE that failed for a moment was taken for final once:
        the launch hook then timed out with its default result, ABANDON, and the group threw away a
        host whose engine was loaded."""
        try:
            instance = self.instance_id
            if isinstance(action, CompleteHook):
                self.autoscaling.complete_lifecycle_action(
                    AutoScalingGroupName=self.group,
                    LifecycleHookName=self.hooks[action.hook],
                    InstanceId=instance,
                    LifecycleActionResult=action.result,
                )
            else:
                self.autoscaling.set_instance_health(
                    InstanceId=instance, HealthStatus="Unhealthy", ShouldRespectGracePeriod=False
                )
        except Exception as exc:
            final = _error_code(exc) == "ValidationError"
            level = log.warning if final or _may_pass(exc) else log.error
            level("host_agent_action_failed", action=repr(action), error=repr(exc), retried=not final)
            return final
        log.info("host_agent_action", action=repr(action), instance=instance)
        return True

    def ship_gpu_metrics(self, metrics_text: str) -> None:
        dimensions = [{"Name": "AutoScalingGroupName", "Value": self.group}]
        datums = gpu_datums(metrics_text, dimensions, datetime.now(UTC))
        for start in range(0, len(datums), 1000):
            self.cloudwatch.put_metric_data(
                Namespace=self.metric_namespace, MetricData=datums[start : start + 1000]
            )


def aws_clients() -> tuple[Any, Any]:
    """The agent's Auto Scaling and CloudWatch clients (the default chain's region and endpoint),
    their calls bounded. botocore's defaults wait 60 s for a reply and try 5 times: an API gone
    silent (a black-holed path, a NAT or endpoint lost) held one round for minutes, and with it the
    next rounds' decisions (a drain's terminate hook, an Unhealthy mark, the launch's hook). GPU
    samples not sent within a round are of no use: two short tries. A lifecycle action or a health
    mark matters more: a retry more, as the edge's DynamoDB client (edge/dynamodb_client.py)."""
    import boto3  # in the image; imported here so --help needs no AWS SDK
    from botocore.config import Config

    autoscaling = Config(connect_timeout=2, read_timeout=5, retries={"mode": "standard", "max_attempts": 3})
    cloudwatch = Config(
        connect_timeout=2, read_timeout=3, retries={"mode": "standard", "total_max_attempts": 2}
    )
    return boto3.client("autoscaling", config=autoscaling), boto3.client("cloudwatch", config=cloudwatch)


def run(
    agent: HostAgent, host: AwsHost, interval_s: float, clock: Callable[[], float] = time.monotonic
) -> None:
    """Observe, decide, act, every `interval_s`, until the host goes away."""
    while True:
        take_round(agent, host, clock())
        time.sleep(interval_s)


def take_round(agent: HostAgent, host: AwsHost, now: float) -> list[Action]:
    """One round: observe, decide, act, and tell the agent what became of each action. The
    actions sent."""
    actions: list[Action] = []
    try:
        seen, metrics_text = host.observe(now)
        actions = agent.step(seen)
        for action in actions:
            agent.report(action, host.act(action), now)
            failures, next_at = agent.retries.get(action, (0, now))
            if failures >= STUCK_AFTER:
                log.error(
                    "host_agent_action_stuck",
                    action=repr(action),
                    failures=failures,
                    next_try_in_s=next_at - now,
                )
        host.ship_gpu_metrics(metrics_text)
    except Exception as exc:  # one failed round (IMDS, API throttling) must not end the agent
        log.warning("host_agent_round_failed", error=repr(exc))
    return actions


def argument_parser() -> argparse.ArgumentParser:
    """The agent's options; its defaults are the gpu_pool module's (tests/iac checks the drain)."""
    parser = argparse.ArgumentParser(
        description="Report Triton's state on this GPU host to its Auto Scaling group."
    )
    parser.add_argument("--group", required=True, help="the host's Auto Scaling group")
    parser.add_argument(
        "--ready-hook", required=True, help="launch lifecycle hook completed once Triton is ready"
    )
    parser.add_argument(
        "--drain-hook", required=True, help="terminate lifecycle hook completed once streams end"
    )
    parser.add_argument("--ready-timeout-s", type=float, default=1740.0, help="abandon the launch after this")
    # The terminate hook's heartbeat (gpu_pool's scale_in_drain_s): a shorter default cut the
    # streams of an agent started without --drain-s while the hook would still have waited.
    parser.add_argument("--drain-s", type=float, default=600.0, help="longest drain on termination")
    parser.add_argument(
        "--min-drain-s",
        type=float,
        default=20.0,
        help="shortest drain: the edges' [upstream] discovery_interval_s and a margin",
    )
    parser.add_argument(
        "--unhealthy-after-s", type=float, default=60.0, help="Triton down this long: Unhealthy"
    )
    parser.add_argument(
        "--metric-namespace", default="Floodgate/GPU", help="CloudWatch namespace of GPU metrics"
    )
    parser.add_argument("--interval-s", type=float, default=10.0)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = argument_parser().parse_args(argv)
    configure_plain_logging()
    host = AwsHost(
        args.group,
        {"ready": args.ready_hook, "drain": args.drain_hook},
        args.metric_namespace,
        *aws_clients(),
    )
    agent = HostAgent(
        args.ready_timeout_s,
        args.drain_s,
        args.unhealthy_after_s,
        started_at=time.monotonic(),
        min_drain_s=min(args.min_drain_s, args.drain_s),
    )
    run(agent, host, args.interval_s)


if __name__ == "__main__":
    main()
