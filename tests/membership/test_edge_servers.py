"""Edges that count themselves, in the real edge: several `floodgate serve` processes on one real
redis-server, in front of one real tritonserver they all reach. Each fills the share of that
replica its membership gives it (checked by what a request that fits half a replica but not a third
gets), one killed without a drain leaves its share
to the others once its TTL ran out, and its users' concurrency slots with it, and a joiner never
makes the shares add up to more than a whole replica (replayed from the processes' own `fleet_view`
log lines); one frozen past its TTL and back again holds its running streams' slots again."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from gpu_container.engine.types import EngineConfig
from tests.edge.sse_client import CHAT, MODEL
from tests.faults.serve_process import ServeProcess, serve_process
from tests.support.redis_server import RedisServer
from tests.support.triton_server import LocalTriton, own_local_triton

HEARTBEAT_S = 0.5  # a beat late by up to one interval still never overbooks (join waits two)
TTL_S = 2.0
WAIT_S = 30.0
# 8 blocks of 16 tokens: one replica holds 128 KV tokens, so 64 is half of it and 42 a third.
HALF_REPLICA_TOKENS = 64


@pytest.fixture(scope="module")
def shared_replica(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalTriton]:
    """The one replica every edge reaches, as a Triton host is: the fleet divides it. (An edge's own
    local engine no other edge fills, so none divides it: tests/edge/test_workers.py.)"""
    config = EngineConfig(block_size=16, num_blocks=8, max_num_seqs=8, max_num_batched_tokens=128)
    with own_local_triton(tmp_path_factory.mktemp("shared-replica"), config) as triton:
        yield triton


class Fleet:
    def __init__(self, tmp_path: Path, redis: RedisServer, replica: LocalTriton, stack: ExitStack) -> None:
        self._tmp_path = tmp_path
        self._redis = redis
        self._replica = replica
        self._stack = stack
        self.edges: dict[str, ServeProcess] = {}
        self.killed_at: dict[str, float] = {}

    def start(
        self, name: str, more: dict[str, dict[str, object]] | None = None, **server: object
    ) -> ServeProcess:
        """`floodgate serve` in the fleet, on the shared replica, with `more` sections; returns once
        its /readyz is 200 (it has joined)."""
        sections: dict[str, dict[str, object]] = {
            "limiter": {"backend": "redis", "redis_url": self._redis.url, "timeout_ms": 2000},
            "fleet": {"heartbeat_s": HEARTBEAT_S, "member_ttl_s": TTL_S},
            "upstream": {"triton": self._replica.spec},
            # The replica's size, which bounds the longest request the edge takes.
            "engine": {"block_size": 16, "num_blocks": 8, "isolation": "thread"},
            "server": {"drain_accept_s": 0.0, "drain_deadline_s": 30.0, **server},
        }
        for section, values in (more or {}).items():
            sections[section] = {**sections.get(section, {}), **values}
        directory = self._tmp_path / name
        directory.mkdir()
        edge = self._stack.enter_context(serve_process(directory, sections))
        self.edges[name] = edge
        return edge

    def kill(self, name: str) -> None:
        self.killed_at[name] = time.time()
        self.edges[name].proc.kill()  # SIGKILL: no leave, no drain; its TTL runs out
        self.edges[name].proc.wait(timeout=30)

    @staticmethod
    def fleet_state(edge: ServeProcess) -> dict[str, Any]:
        return dict(httpx.get(edge.ops_url + "/readyz", timeout=10.0).json().get("fleet", {}))

    def wait_shares(self, names: list[str], share: float, live: int) -> None:
        def ok() -> bool:
            states = [self.fleet_state(self.edges[n]) for n in names]
            return all(
                s.get("source") == "redis" and s.get("live") == live and abs(s["share"] - share) < 1e-6
                for s in states
            )

        wait_for(f"{names} at share {share:.3f} of {live} live", ok)

    def max_total_share(self, field: str = "share") -> float:
        """Replay every edge's shares (its `fleet_view` log lines, a killed edge's share falls to 0
        when it dies): the largest sum at any instant. `field="replicas_filled"`: how many edges
        held any of the one replica at once (with members_per_replica, where `share` counts every
        edge whatever it holds)."""
        events: list[tuple[float, str, float]] = []
        for name, edge in self.edges.items():
            for line in edge.output().splitlines():
                if '"fleet_view"' not in line:
                    continue
                record = json.loads(line)
                at = datetime.fromisoformat(record["timestamp"]).timestamp()
                events.append((at, name, float(record[field])))
        events += [(at, name, 0.0) for name, at in self.killed_at.items()]
        current: dict[str, float] = {}
        worst = 0.0
        for _, name, share in sorted(events):
            current[name] = share
            worst = max(worst, sum(current.values()))
        return worst

    def first_share(self, name: str) -> float:
        line = next(x for x in self.edges[name].output().splitlines() if '"fleet_view"' in x)
        return float(json.loads(line)["share"])


def wait_for(what: str, predicate: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)  # polling the edges' /readyz: they offer nothing to wait on


@pytest.fixture
def fleet(tmp_path: Path, redis_server: RedisServer, shared_replica: LocalTriton) -> Iterator[Fleet]:
    with ExitStack() as stack:
        yield Fleet(tmp_path, redis_server, shared_replica, stack)


def _chat(edge: ServeProcess, max_tokens: int) -> httpx.Response:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens}
    return httpx.post(edge.base_url + CHAT, json=body, headers=edge.auth(), timeout=60.0)


def test_shares_follow_the_live_edges_and_a_killed_one_is_counted_out(fleet: Fleet) -> None:
    a = fleet.start("a")
    # Alone in the fleet: the whole replica, at once.
    fleet.wait_shares(["a"], 1.0, 1)
    prompt_tokens = _chat(a, 1).json()["usage"]["prompt_tokens"]
    half = HALF_REPLICA_TOKENS - prompt_tokens  # fits half a replica, not a third
    fleet.start("b")
    fleet.start("c")
    fleet.wait_shares(["a", "b", "c"], 1 / 3, 3)
    refused = _chat(a, half)
    assert refused.status_code == 503
    assert refused.json()["error"]["code"] == "no_replica"

    fleet.kill("c")
    fleet.wait_shares(["a", "b"], 1 / 2, 2)
    assert _chat(a, half).status_code == 200
    assert fleet.max_total_share() <= 1.0 + 1e-9


@pytest.mark.parametrize(("members_per_replica", "serving"), [(0, 0), (1, 1)])
def test_with_a_member_per_replica_a_request_past_a_third_of_it_is_served(
    fleet: Fleet, members_per_replica: int, serving: int
) -> None:
    """Three edges dividing the replica hold a third of it each: a request charged two thirds of it
    fits none of them, answered 503 no_replica (with a Retry-After, for ever) at every edge though
    it fits the replica. With [fleet] members_per_replica = 1 the replica is one edge's whole, the
    same edge for all three, and that edge serves it; the other two hold none of it."""
    more: dict[str, dict[str, object]] = {}
    if members_per_replica:
        more["fleet"] = {"members_per_replica": members_per_replica}
    a = fleet.start("a", more)
    fleet.wait_shares(["a"], 1.0, 1)
    prompt_tokens = _chat(a, 1).json()["usage"]["prompt_tokens"]
    two_thirds = 2 * HALF_REPLICA_TOKENS * 2 // 3 - prompt_tokens  # 6 of the 8 blocks: past a half
    fleet.start("b", more)
    fleet.start("c", more)
    # Every edge serving (its own join wait over: one the joiners pushed off the replica had seen
    # them, at its next beat, by then).
    fleet.wait_shares(["a", "b", "c"], 1 / 3, 3)
    answers = {name: _chat(edge, two_thirds) for name, edge in fleet.edges.items()}
    codes = {name: (r.status_code, r.json().get("error", {}).get("code")) for name, r in answers.items()}
    assert sorted(codes.values(), key=str) == sorted(
        [(200, None)] * serving + [(503, "no_replica")] * (3 - serving), key=str
    ), codes
    assert fleet.max_total_share("replicas_filled" if members_per_replica else "share") <= 1.0 + 1e-9


def test_a_joining_edge_waits_for_room_and_never_overbooks(fleet: Fleet) -> None:
    fleet.start("a")
    fleet.start("b")
    fleet.wait_shares(["a", "b"], 1 / 2, 2)
    fleet.start("c")  # returns once its /readyz said 200: it waited through "joining" first
    fleet.wait_shares(["a", "b", "c"], 1 / 3, 3)
    assert fleet.first_share("c") == 0.0
    assert fleet.max_total_share() <= 1.0 + 1e-9


def test_a_draining_edge_hands_its_share_over(fleet: Fleet) -> None:
    fleet.start("a")
    b = fleet.start("b")
    fleet.wait_shares(["a", "b"], 1 / 2, 2)
    b.proc.send_signal(signal.SIGTERM)
    # b takes no new work at once and leaves when its (no) streams ended: a has it all.
    fleet.wait_shares(["a"], 1.0, 1)
    assert b.proc.wait(timeout=30) == 0
    assert json.loads([x for x in b.output().splitlines() if '"fleet_view"' in x][-1])["share"] == 0.0
    assert fleet.max_total_share() <= 1.0 + 1e-9


def test_a_killed_edges_users_get_their_concurrency_slots_back(
    fleet: Fleet, redis_server: RedisServer
) -> None:
    """A user at their concurrency limit through an edge that is killed mid-stream: the stream died
    with the edge, and the other edge admits the user's next request once the killed one is counted
    out (TTL_S), not after the slot's own TTL ([limiter] slot_ttl_s, 300 s here)."""
    more: dict[str, dict[str, object]] = {
        "tiers.paid": {"max_concurrent": 1},
        # Each its own local engine, with room for the long stream below.
        "upstream": {"triton": ""},
        "engine": {"num_blocks": 512},
        "limiter": {"slot_ttl_s": 300},
    }
    a = fleet.start("a", more)
    b = fleet.start("b", more)
    fleet.wait_shares(["a", "b"], 1 / 2, 2)
    store = redis.Redis.from_url(redis_server.url)
    messages = [{"role": "user", "content": "hi"}]
    # Past the end token: a sampled reply that ended at once settled its slot before the kill.
    long = {"model": MODEL, "messages": messages, "max_tokens": 2000, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", a.base_url + CHAT, json=long, headers=a.auth(), timeout=60.0) as stream:
        assert stream.status_code == 200
        # Kept: a line iterator dropped mid-response closes the connection when collected, and the
        # edge, seeing its client gone, settled the slot before the kill whenever it was quicker.
        lines = stream.iter_lines()
        next(line for line in lines if line.startswith("data:"))  # it runs
        fleet.kill("a")
    slots = [key for key in store.scan_iter("fg:{*}:conc") if store.zcard(key)]
    assert len(slots) == 1, f"no slot left to free; the killed edge's log:\n{a.output()[-6000:]}"

    # Until the killed edge is counted out, its dead stream's slot refuses the user.
    refused = _chat(b, 1)
    assert refused.status_code == 429 and refused.json()["error"]["type"] == "concurrency"
    wait_for("b admits the killed edge's user", lambda: _chat(b, 1).status_code == 200)
    store.close()


def test_an_edge_back_from_a_stall_holds_its_running_streams_slots_again(
    fleet: Fleet, redis_server: RedisServer
) -> None:
    """An edge frozen past its membership TTL (SIGSTOP: a frozen VM, a blocked loop) is counted out,
    and the other edge frees its user's slot as a dead edge's. It only stalled: back (SIGCONT), its
    stream goes on, and its slot is put back, so the other edge refuses the user again until that
    stream ends, instead of letting them run past their concurrency limit."""
    more: dict[str, dict[str, object]] = {
        "tiers.paid": {"max_concurrent": 1},
        # Each its own local engine, with room for the long stream below.
        "upstream": {"triton": ""},
        "engine": {"num_blocks": 512},
        "limiter": {"slot_ttl_s": 300},
    }
    # The stream below stops being read: it stays open on its unsent events, not cut as stalled.
    a = fleet.start("a", more, stalled_reader_s=300.0)
    b = fleet.start("b", more)
    fleet.wait_shares(["a", "b"], 1 / 2, 2)
    store = redis.Redis.from_url(redis_server.url)
    messages = [{"role": "user", "content": "hi"}]
    long = {"model": MODEL, "messages": messages, "max_tokens": 2000, "stream": True, "ignore_eos": True}

    def held() -> int:
        return sum(int(store.zcard(key)) for key in store.scan_iter("fg:{*}:conc"))

    with httpx.stream("POST", a.base_url + CHAT, json=long, headers=a.auth(), timeout=60.0) as stream:
        assert stream.status_code == 200
        # Kept: a line iterator dropped mid-response closes the connection when collected.
        lines = stream.iter_lines()
        next(line for line in lines if line.startswith("data:"))  # admitted, slot held
        a.proc.send_signal(signal.SIGSTOP)
        try:
            wait_for("b admits the stalled edge's user", lambda: _chat(b, 1).status_code == 200)
        finally:
            a.proc.send_signal(signal.SIGCONT)
        # Until b's next beat its view still has a departed, and would free the slot again (a puts
        # it back once more when it serves again, membership.py).
        wait_for("b sees a back", lambda: fleet.fleet_state(b).get("live") == 2)
        wait_for("a's running stream holds its slot again", lambda: held() == 1)
        refused = _chat(b, 1)
        assert refused.status_code == 429 and refused.json()["error"]["type"] == "concurrency"
    # The stream closed: a settles it and frees the slot.
    wait_for("b admits the user once a's stream ended", lambda: _chat(b, 1).status_code == 200)
    store.close()
    # b took a's share while a was out: a came back as a joiner (share 0) until b made room. Alone
    # at its start, a never had a share of 0 before.
    views = [json.loads(x) for x in a.output().splitlines() if '"fleet_view"' in x]
    assert any(v["share"] == 0.0 and v["source"] == "redis" for v in views), views
