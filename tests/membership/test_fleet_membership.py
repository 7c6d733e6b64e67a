"""Edges that count themselves: several edge processes (python -m edge.membership, the real
membership loop) on one real redis-server; one killed, one drained, one joining, Redis itself
killed. Each process prints its view on every change with a wall-clock time, so the tests can
replay the fleet's timeline and check the shares never add up to more than a replica."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import anyio
import pytest
import redis

from edge.membership.membership import FleetMembership, MembershipSettings
from edge.membership.registry import MembershipRegistry
from edge.membership.shares import fallback_view, view_from_claims
from limiter import redis_url
from tests.support.redis_server import RedisServer, start_redis
from tests.support.stalling_proxy import stalling_proxy

INTERVAL_S = 0.2
TTL_S = 0.8
WAIT_S = 30.0


@dataclass
class Edge:
    name: str
    process: subprocess.Popen[str]
    views: list[dict[str, Any]] = field(default_factory=list)

    @property
    def last(self) -> dict[str, Any]:
        return self.views[-1] if self.views else {}


class Fleet:
    def __init__(self, redis: RedisServer) -> None:
        self.redis = redis
        self.edges: dict[str, Edge] = {}
        self.killed_at: dict[str, float] = {}
        self._cond = threading.Condition()

    def start(
        self, name: str, instance_count: int = 1, stale_after_s: float = 1.0, redis_url: str = ""
    ) -> Edge:
        """`redis_url`: the Redis the edge reaches, when not the fleet's own directly (a proxy)."""
        args = [sys.executable, "-m", "edge.membership", "--redis", redis_url or self.redis.url, "--id", name]
        args += ["--interval", str(INTERVAL_S), "--ttl", str(TTL_S), "--stale-after", str(stale_after_s)]
        args += ["--instance-count", str(instance_count), "--drain-s", "2.0"]  # ~10 beats: room on a busy box
        process = subprocess.Popen(
            args, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"}
        )
        edge = Edge(name, process)
        self.edges[name] = edge
        threading.Thread(target=self._read, args=(edge,), daemon=True).start()
        return edge

    def _read(self, edge: Edge) -> None:
        assert edge.process.stdout is not None
        for line in edge.process.stdout:
            if not line.startswith("{"):
                continue
            with self._cond:
                edge.views.append(json.loads(line))
                self._cond.notify_all()

    def wait(self, what: str, predicate: Callable[[], bool]) -> None:
        with self._cond:
            if not self._cond.wait_for(predicate, WAIT_S):
                state = {n: e.last for n, e in self.edges.items()}
                raise AssertionError(f"timed out waiting for {what}: {state}")

    def serving(self, names: list[str], share: float, divisor: int) -> Callable[[], bool]:
        def ok() -> bool:
            return all(
                self.edges[n].last.get("source") == "redis"
                and abs(self.edges[n].last["share"] - share) < 1e-9
                and self.edges[n].last["divisor"] == divisor
                for n in names
            )

        return ok

    def max_total_held(self) -> float:
        """Replay what every edge may hold of a replica as a step function of time (a killed edge
        holds nothing from its death: its streams died with it): the largest sum at any instant."""
        events = sorted((v["t"], e.name, v["held"]) for e in self.edges.values() for v in e.views)
        events += [(t, name, 0.0) for name, t in self.killed_at.items()]
        events.sort()
        current: dict[str, float] = {}
        worst = 0.0
        for _, name, share in events:
            current[name] = share
            worst = max(worst, sum(current.values()))
        return worst

    def stop(self) -> None:
        for edge in self.edges.values():
            if edge.process.poll() is None:
                edge.process.kill()
            edge.process.wait(timeout=10)


@pytest.fixture
def fleet(redis_server: RedisServer) -> Iterator[Fleet]:
    f = Fleet(redis_server)
    yield f
    f.stop()


def test_shares_follow_the_live_count_when_one_edge_is_killed(fleet: Fleet) -> None:
    for name in ("a", "b", "c"):
        fleet.start(name)
    fleet.wait("three edges at 1/3", fleet.serving(["a", "b", "c"], 1 / 3, 3))
    fleet.killed_at["c"] = time.time()
    fleet.edges["c"].process.kill()  # SIGKILL: no goodbye, its TTL runs out
    fleet.wait("two edges at 1/2", fleet.serving(["a", "b"], 1 / 2, 2))
    assert fleet.max_total_held() <= 1.0 + 1e-9
    # c is departed (its slots are freed, tests/membership/test_edge_servers.py): the survivors say so.
    fleet.wait("c departed", lambda: all(fleet.edges[n].last.get("departed") == ["c"] for n in ("a", "b")))


def test_an_edge_left_alone_counts_the_killed_one_out(fleet: Fleet) -> None:
    """Alone, its own beats are the fleet's only ones, a beat period apart: that is no outage of
    Redis (heartbeat.lua moves expiries on only past a longer silence), so the dead one's TTL runs."""
    fleet.start("a")
    fleet.start("b")
    fleet.wait("two edges at 1/2", fleet.serving(["a", "b"], 1 / 2, 2))
    fleet.edges["b"].process.kill()
    fleet.wait("a alone at 1", fleet.serving(["a"], 1.0, 1))
    assert fleet.edges["a"].last["departed"] == ["b"]


def test_a_joining_edge_never_double_books(fleet: Fleet) -> None:
    fleet.start("a")
    fleet.start("b")
    fleet.wait("two edges at 1/2", fleet.serving(["a", "b"], 1 / 2, 2))
    joiner = fleet.start("c")
    fleet.wait("three edges at 1/3", fleet.serving(["a", "b", "c"], 1 / 3, 3))
    # The newcomer said share 0 first (it waited for the others to make room)...
    assert joiner.views[0]["share"] == 0.0
    # ...so at no instant did the three claim more than the whole replica.
    assert fleet.max_total_held() <= 1.0 + 1e-9


def test_a_draining_edge_hands_its_share_over_gradually(fleet: Fleet) -> None:
    for name in ("a", "b", "c"):
        fleet.start(name)
    fleet.wait("three edges at 1/3", fleet.serving(["a", "b", "c"], 1 / 3, 3))
    fleet.edges["c"].process.send_signal(signal.SIGTERM)
    fleet.wait("c gone", lambda: fleet.edges["c"].last.get("source") == "left")
    fleet.wait("two edges at 1/2", fleet.serving(["a", "b"], 1 / 2, 2))
    # While c drained it took nothing new but its streams still held their part...
    assert any(v["share"] == 0.0 and v["held"] > 0.0 for v in fleet.edges["c"].views)
    # ...and between 1/3 and 1/2 the others passed through intermediate shares: the leaver's claim fell
    # with its streams instead of vanishing at once.
    between = {
        round(v["share"], 6) for v in fleet.edges["a"].views if 1 / 3 + 1e-6 < v["share"] < 1 / 2 - 1e-6
    }
    assert between
    assert fleet.max_total_held() <= 1.0 + 1e-9


def test_redis_gone_falls_back_to_instance_count(fleet: Fleet, redis_server: RedisServer) -> None:
    fleet.start("a", instance_count=4)
    fleet.start("b", instance_count=4)
    fleet.wait("two edges at 1/2", fleet.serving(["a", "b"], 1 / 2, 2))
    redis_server.kill()
    fleet.wait(
        "instance_count fallback",
        lambda: all(fleet.edges[n].last.get("source") == "fallback" for n in ("a", "b")),
    )
    for name in ("a", "b"):
        sources = [v["source"] for v in fleet.edges[name].views]
        assert "stale" in sources  # the last view held for a while first
        assert fleet.edges[name].last["share"] == 0.25
        assert fleet.edges[name].last["divisor"] == 4


def test_a_redis_restarted_empty_leaves_every_edge_serving(fleet: Fleet, redis_server: RedisServer) -> None:
    """Nobody counted anybody out (the fleet's keys are simply gone): the edges register again and
    keep their shares, none goes back through the join wait (share 0) as one back from a stall
    past its TTL does, and the first to register does not take the whole replica while the
    other, not registered yet, still fills its half."""
    fleet.start("a")
    fleet.start("b")
    fleet.wait("two edges at 1/2", fleet.serving(["a", "b"], 1 / 2, 2))
    seen = {name: len(fleet.edges[name].views) for name in ("a", "b")}
    redis_server.kill()
    restarted = start_redis(redis_server.port)
    probe = redis.Redis.from_url(restarted.url)
    try:
        # Both register on the empty Redis, then beat once more: by then each has printed what its
        # registering beat made of the fleet (a share of 0 with a join wait, before the mend).
        registered = _beats_after(probe, {"a": 0.0, "b": 0.0})
        _beats_after(probe, registered)
        fleet.wait("two edges at 1/2", fleet.serving(["a", "b"], 1 / 2, 2))
        for name in ("a", "b"):
            assert all(v["share"] > 0 for v in fleet.edges[name].views[seen[name] :]), fleet.edges[name].views
        assert fleet.max_total_held() <= 1.0 + 1e-9, [
            (n, v["held"]) for n, e in fleet.edges.items() for v in e.views
        ]
    finally:
        probe.close()
        restarted.kill()


@pytest.mark.parametrize("regime", ["stale", "fallback"])
def test_a_redis_out_of_reach_past_the_ttl_counts_nobody_out(
    fleet: Fleet, redis_server: RedisServer, regime: str
) -> None:
    """Redis out of every member's reach (a failover, a partition) for longer than their TTL, by its
    own clock: no member could beat, so none is dead. Once it answers, every edge keeps serving its
    share: none is named departed (its users' slots freed under its running streams) and none goes
    back through the join wait (share 0), whether the outage outlasted stale_after_s or not."""
    stale_after_s = 30.0 if regime == "stale" else 1.0
    with stalling_proxy(redis_server.port) as proxy:
        via = f"redis://127.0.0.1:{proxy.port}/0"
        fleet.start("a", stale_after_s=stale_after_s, redis_url=via)
        fleet.start("b", stale_after_s=stale_after_s, redis_url=via)
        fleet.wait("two edges at 1/2", fleet.serving(["a", "b"], 1 / 2, 2))
        probe = redis.Redis.from_url(redis_server.url)
        try:
            proxy.black_hole()
            try:
                fleet.wait(
                    f"both edges on a {regime} view",
                    lambda: all(fleet.edges[n].last.get("source") == regime for n in ("a", "b")),
                )
                seen = {name: len(fleet.edges[name].views) for name in ("a", "b")}
                # Their last beats are in; the outage outlasts both expiries (Redis's clock is this
                # host's).
                key = "{floodgate:edges}:expiry"
                expiries = {m.decode(): s for m, s in probe.zrange(key, 0, -1, withscores=True)}
                assert set(expiries) == {"a", "b"}
                time.sleep(max(0.0, max(expiries.values()) / 1000 + 0.1 - time.time()))
            finally:
                proxy.resume()
            # Each member beats twice once Redis is in reach again: what the first beat after the
            # outage made of the fleet is in their views by then.
            _beats_after(probe, _beats_after(probe, expiries))
            fleet.wait("two edges at 1/2", fleet.serving(["a", "b"], 1 / 2, 2))
            for name in ("a", "b"):
                after = fleet.edges[name].views[seen[name] :]
                assert all(v["share"] > 0 and v["departed"] == [] for v in after), [
                    (v["source"], v["share"], v["departed"]) for v in after
                ]
        finally:
            probe.close()
            fleet.stop()


def _beats_after(probe: redis.Redis, last: dict[str, float]) -> dict[str, float]:
    """Each member's expiry in the fleet's sorted set once every one has beaten since `last`
    (polling Redis: the members offer nothing to wait on)."""
    deadline = time.monotonic() + WAIT_S
    while True:
        now = {m.decode(): s for m, s in probe.zrange("{floodgate:edges}:expiry", 0, -1, withscores=True)}
        if all(now.get(name, 0.0) > at for name, at in last.items()):
            return now
        assert time.monotonic() < deadline, f"no beat on the restarted Redis: {now}"
        time.sleep(0.02)


def test_view_arithmetic() -> None:
    claims = {"a": 1.0, "b": 1.0, "c": 0.5}  # c drains, half its streams left
    a = view_from_claims(claims, "a", "serving")
    assert a.share == a.held == pytest.approx(1 / 2.5)
    assert a.divisor == 3
    c = view_from_claims(claims, "c", "draining")
    assert (c.share, c.held) == (0.0, pytest.approx(0.5 / 2.5))
    joining = view_from_claims({"a": 1.0, "b": 1.0}, "b", "joining")
    assert (joining.share, joining.held) == (0.0, 0.0)
    assert fallback_view(4).share == 0.25


@pytest.mark.anyio
async def test_a_member_that_stops_beating_is_departed_until_it_beats_again(
    redis_server: RedisServer,
) -> None:
    """By its tag (the id's part after the last ':', which its request ids carry); one that leaves
    itself is not departed (its streams settled), and the departed are forgotten after remember_s."""
    client = redis_url.connect(redis_server.url)
    registry = MembershipRegistry(client, "departed-test", remember_s=300)
    try:
        assert not (await registry.beat("host:1:aaaa1111", 1.0, ttl_s=0.001)).back  # a first beat
        await registry.beat("host:2:bbbb2222", 1.0, ttl_s=60)
        await registry.beat("host:3:cccc3333", 1.0, ttl_s=60)
        deadline = time.monotonic() + WAIT_S
        while (fleet := await registry.beat("host:2:bbbb2222", 1.0, ttl_s=60)).departed != ("aaaa1111",):
            assert time.monotonic() < deadline, fleet
        assert set(fleet.claims) == {"host:2:bbbb2222", "host:3:cccc3333"}

        await registry.leave("host:3:cccc3333")
        assert (await registry.beat("host:2:bbbb2222", 1.0, ttl_s=60)).departed == ("aaaa1111",)

        back = await registry.beat("host:1:aaaa1111", 1.0, ttl_s=60)  # a stall, not a crash
        assert back.departed == () and "host:1:aaaa1111" in back.claims and back.back
        assert not (await registry.beat("host:1:aaaa1111", 1.0, ttl_s=60)).back  # back once
        assert not (await registry.leave("host:2:bbbb2222")).back

        brief = MembershipRegistry(client, "departed-brief", remember_s=0.001)
        await brief.beat("host:4:dddd4444", 1.0, ttl_s=0.001)
        while len((fleet := await brief.beat("host:5:eeee5555", 1.0, ttl_s=60)).claims) > 1:
            assert time.monotonic() < deadline, fleet
        while (await brief.beat("host:5:eeee5555", 1.0, ttl_s=60)).departed:
            assert time.monotonic() < deadline, "a departed member was never forgotten"

        # A Redis that lost the fleet (restarted empty): nobody counted anyone out.
        await client.flushdb()
        lost = await registry.beat("host:1:aaaa1111", 1.0, ttl_s=60)
        assert not lost.back and lost.unknown  # its own entry gone too: the others' may be
        assert not (await registry.beat("host:1:aaaa1111", 1.0, ttl_s=60)).unknown
    finally:
        await client.aclose()


@pytest.mark.anyio
async def test_a_member_back_whose_first_answer_was_lost_still_rejoins(redis_server: RedisServer) -> None:
    """Counted out by the others (its slots freed, its share taken), the member's next beat brings it
    back, but that beat's answer is lost (a reply slower than the socket timeout; a RedisCluster
    client then sends the script again at once): its next beat must still say it is back.
    Otherwise it serves at once beside the others' whole shares and never puts its running
    requests' slots back."""
    settings = MembershipSettings(
        interval_s=0.2, join_wait_s=0.4, ttl_s=0.8, fleet="lost-answer", timeout_s=0.5
    )
    other_client = redis_url.connect(redis_server.url)
    other = MembershipRegistry(other_client, settings.fleet, quiet_s=settings.quiet_s)
    with stalling_proxy(redis_server.port) as proxy:
        client = redis_url.connect(
            f"redis://127.0.0.1:{proxy.port}/0", socket_timeout=0.5, socket_connect_timeout=0.5
        )
        now = [0.0]
        backs: list[float] = []
        member = FleetMembership(
            client, "host:2:bbbb2222", settings, clock=lambda: now[0], on_back=lambda: backs.append(now[0])
        )
        try:
            await other.beat("host:1:aaaa1111", 1.0, ttl_s=60)
            await member.beat_once()  # a joiner beside a, then serving half the replica
            now[0] += settings.join_wait_s
            assert (await member.beat_once()).share == pytest.approx(1 / 2)
            # b stops beating (cut off alone); a's beats count it out.
            deadline = time.monotonic() + WAIT_S
            while (await other.beat("host:1:aaaa1111", 1.0, ttl_s=60)).departed != ("bbbb2222",):
                assert time.monotonic() < deadline, "b was never counted out"
                await anyio.sleep(0.02)

            proxy.lose_next_reply()
            now[0] += 1.0
            lost = await member.beat_once()
            assert proxy.replies_lost == 1
            assert lost.source == "stale" and not backs  # the answer that said "back" never came
            now[0] += settings.interval_s
            view = await member.beat_once()
            # Back: it waits for a to make room (share 0) and puts its slots back.
            assert (view.source, view.share, backs) == ("redis", 0.0, [now[0]])
            now[0] += settings.interval_s
            assert (await member.beat_once()).share == 0.0 and len(backs) == 1  # back once
        finally:
            await client.aclose()
            await other_client.aclose()


@pytest.mark.anyio
async def test_a_member_whose_first_beat_finds_no_redis_waits_stale_after_before_the_fallback(
    redis_server: RedisServer,
) -> None:
    """A beat that fails once (a Redis slow past the socket timeout, a failover under way) is no
    outage yet: the members already in the fleet hold their last view for stale_after_s. One whose
    first beat failed fell back at once to 1 / instance_count of every replica (all of it at the
    default 1) beside their whole shares, with no join wait; it holds nothing as long as they do."""
    settings = MembershipSettings(
        interval_s=0.2, join_wait_s=0.4, ttl_s=0.8, stale_after_s=1.0, fleet="first-miss", timeout_s=0.3
    )
    direct = redis_url.connect(redis_server.url)
    await MembershipRegistry(direct, settings.fleet).beat("host:1:aaaa1111", 1.0, ttl_s=60)  # serving
    await direct.aclose()
    with stalling_proxy(redis_server.port) as proxy:
        client = redis_url.connect(
            f"redis://127.0.0.1:{proxy.port}/0", socket_timeout=0.3, socket_connect_timeout=0.3
        )
        now = [0.0]
        member = FleetMembership(client, "host:2:bbbb2222", settings, clock=lambda: now[0])
        try:
            proxy.black_hole()
            first = await member.beat_once()
            assert (first.source, first.held) == ("stale", 0.0)
            now[0] += settings.stale_after_s
            fallback = await member.beat_once()  # out of reach as long as the others' last views hold
            assert (fallback.source, fallback.held) == ("fallback", 1.0)
            proxy.resume()
            now[0] += settings.interval_s
            assert (await member.beat_once()).held == 0.0  # reached: it joins beside a
        finally:
            await client.aclose()


@pytest.mark.anyio
async def test_a_member_cut_off_past_remember_departed_rejoins_as_a_newcomer(
    redis_server: RedisServer,
) -> None:
    """Cut off from Redis alone for longer than remember_departed_s: the others counted it out
    (taking its share) and have since forgotten it as departed, so Redis no longer says it is
    back. Reconnected, it read the fleet as one Redis had lost, kept serving at once beside the
    other's whole replica, and never put its running requests' slots back. It must rejoin
    through the join wait, be counted in by the others, and count itself once."""
    remember_s = 0.3
    settings = MembershipSettings(
        interval_s=0.2,
        join_wait_s=0.4,
        ttl_s=0.8,
        stale_after_s=1.0,
        remember_departed_s=remember_s,
        fleet="forgotten",
        timeout_s=0.3,
    )
    other_client = redis_url.connect(redis_server.url)
    other = MembershipRegistry(other_client, settings.fleet, remember_s, settings.quiet_s)
    with stalling_proxy(redis_server.port) as proxy:
        client = redis_url.connect(
            f"redis://127.0.0.1:{proxy.port}/0", socket_timeout=0.3, socket_connect_timeout=0.3
        )
        now = [0.0]
        backs: list[float] = []
        member = FleetMembership(
            client, "host:2:bbbb2222", settings, clock=lambda: now[0], on_back=lambda: backs.append(now[0])
        )
        try:
            await other.beat("host:1:aaaa1111", 1.0, ttl_s=60)
            await member.beat_once()
            now[0] += settings.join_wait_s
            assert (await member.beat_once()).share == pytest.approx(1 / 2)

            proxy.black_hole()  # b cut off alone: its beats fail, a's count it out, then forget it
            now[0] += settings.stale_after_s + settings.interval_s
            assert (await member.beat_once()).source == "fallback"
            deadline = time.monotonic() + WAIT_S
            while (await other.beat("host:1:aaaa1111", 1.0, ttl_s=60)).departed != ("bbbb2222",):
                assert time.monotonic() < deadline, "b was never counted out"
                await anyio.sleep(0.02)
            while (fleet := await other.beat("host:1:aaaa1111", 1.0, ttl_s=60)).departed:
                assert time.monotonic() < deadline, "b was never forgotten"
                await anyio.sleep(0.02)
            assert set(fleet.claims) == {"host:1:aaaa1111"}  # a holds the whole replica

            proxy.resume()
            now[0] += settings.interval_s
            view = await member.beat_once()
            # Back: it waits for a to make room (share 0), puts its slots back, counts itself once.
            assert (view.source, view.share, view.held, view.live, backs) == ("redis", 0.0, 0.0, 2, [now[0]])
            assert set((await other.beat("host:1:aaaa1111", 1.0, ttl_s=60)).claims) == {
                "host:1:aaaa1111",
                "host:2:bbbb2222",
            }
            now[0] += settings.join_wait_s
            view = await member.beat_once()
            assert (view.share, view.live, view.divisor) == (pytest.approx(1 / 2), 2, 2)
            assert len(backs) == 2  # and once more as it serves (the others named it departed)
        finally:
            await client.aclose()
            await other_client.aclose()


@pytest.mark.anyio
async def test_a_newcomer_on_a_redis_just_emptied_holds_no_more_than_its_instance_count_share(
    redis_server: RedisServer,
) -> None:
    """Redis emptied under a serving fleet (restarted without persistence, FLUSHALL, a failover to
    an empty replica) and a brand-new edge beats before the others register again: nothing there
    tells it from the first member of a new fleet. It served every replica whole at once beside
    their halves (2 replicas' worth, a limit divisor of 1) until its next beat. Told by
    instance_count that the fleet is several, it serves at once but holds no more than a full
    fleet would give it, 1 / instance_count (limits divided by instance_count), for a join wait,
    by when every member has beaten: its own second beat may find some registered and not others."""
    n = 3
    settings = MembershipSettings(
        instance_count=n, interval_s=0.2, join_wait_s=0.4, ttl_s=0.8, fleet="emptied"
    )
    client = redis_url.connect(redis_server.url)
    now = [0.0]
    a, b, c = (
        FleetMembership(client, f"host:{i}:{t * 8}", settings, clock=lambda: now[0])
        for i, t in ((1, "a"), (2, "b"), (3, "c"))
    )

    def held() -> float:
        return a.view.held + b.view.held + c.view.held

    try:
        await a.beat_once()
        await b.beat_once()
        now[0] += settings.join_wait_s
        assert (await a.beat_once()).share == (await b.beat_once()).share == pytest.approx(1 / 2)

        await client.flushall()
        first = await c.beat_once()  # before a and b register again: alone, serving at once
        assert (first.live, first.share, first.held) == (1, pytest.approx(1 / n), pytest.approx(1 / n))
        assert first.divisor == n
        assert held() == pytest.approx(1 + 1 / n)  # over by its full-fleet share for a beat, not a replica
        await a.beat_once()  # a keeps b's claim until b registers again, and counts c in
        assert (a.view.live, a.view.share) == (3, pytest.approx(1 / 3))
        now[0] += settings.interval_s
        second = await c.beat_once()  # a registered, b not yet: alone with a it would take 1/2
        assert (second.live, second.share, second.divisor) == (2, pytest.approx(1 / n), n)
        await b.beat_once()
        assert (b.view.live, b.view.share) == (3, pytest.approx(1 / 3))
        assert held() == pytest.approx(1.0)
        now[0] += settings.join_wait_s - settings.interval_s
        for member in (a, b, c):
            assert ((await member.beat_once()).live, member.view.share, member.view.divisor) == (
                3,
                pytest.approx(1 / 3),
                3,
            )
        assert held() == pytest.approx(1.0)
    finally:
        await client.aclose()


@pytest.mark.anyio
@pytest.mark.parametrize("members_per_replica", [0, 2])
async def test_the_first_member_of_a_fleet_of_several_takes_work_at_once(
    redis_server: RedisServer, members_per_replica: int
) -> None:
    """A fresh `serve --workers 2` (instance_count 2) or the first edge of a multi-instance
    deployment: no join wait (a start-up delay of two beats on every fresh start), but 1 /
    instance_count of each replica and the limits divided by instance_count until a join wait
    shows the fleet is itself alone; then the whole. A lone edge (instance_count 1, the default)
    serves whole at once."""
    settings = MembershipSettings(
        instance_count=2,
        interval_s=0.2,
        join_wait_s=0.4,
        ttl_s=0.8,
        fleet=f"fresh-{members_per_replica}",
        members_per_replica=members_per_replica,
    )
    client = redis_url.connect(redis_server.url)
    now = [0.0]
    first = FleetMembership(client, "host:1:aaaaaaaa", settings, clock=lambda: now[0])
    try:
        view = await first.beat_once()  # what start() does before beating in the background
        assert not first.joining
        assert (view.share, view.held_of("replica-1"), view.divisor) == (0.5, 0.5, 2)
        now[0] += settings.interval_s
        view = await first.beat_once()
        assert (view.share, view.held_of("replica-1"), view.divisor) == (0.5, 0.5, 2)
        now[0] += settings.join_wait_s - settings.interval_s
        view = await first.beat_once()
        assert (view.share, view.held_of("replica-1"), view.divisor) == (1.0, 1.0, 1)

        lone = FleetMembership(client, "host:2:bbbbbbbb", replace(settings, instance_count=1, fleet="lone"))
        view = await lone.beat_once()
        assert (view.share, view.held_of("replica-1"), view.divisor) == (1.0, 1.0, 1)
    finally:
        await first.aclose()
        await client.aclose()


@pytest.mark.anyio
async def test_a_redis_that_loses_the_members_but_keeps_the_epoch_sends_nobody_through_the_join_wait(
    redis_server: RedisServer,
) -> None:
    """Redis drops the fleet's member entries but keeps its epoch (a maxmemory volatile-* policy
    evicting the expiry set, a key deleted by hand) between two beats of members that beat on
    time: nobody can have been counted out (each one's entry was live until then), so this is a
    Redis that lost the fleet, and every member keeps serving as it was. Taken as counted out and
    forgotten (unknown under the same epoch), every member went through the join wait at once,
    the fleet serving nothing for join_wait_s."""
    settings = MembershipSettings(
        interval_s=0.2,
        join_wait_s=0.4,
        ttl_s=0.8,
        stale_after_s=1.0,
        remember_departed_s=0.3,
        fleet="evicted",
    )
    client = redis_url.connect(redis_server.url)
    now = [0.0]
    backs: list[str] = []
    a, b = (
        FleetMembership(client, m, settings, clock=lambda: now[0], on_back=lambda m=m: backs.append(m))
        for m in ("host:1:aaaa1111", "host:2:bbbb2222")
    )
    try:
        await a.beat_once()
        await b.beat_once()
        now[0] += settings.join_wait_s
        await a.beat_once()
        assert (await b.beat_once()).share == pytest.approx(1 / 2)

        assert await client.delete("{floodgate:evicted}:expiry") == 1  # evicted; the epoch kept
        now[0] += settings.interval_s
        views = [await a.beat_once(), await b.beat_once()]
        assert [(v.share, v.live) for v in views] == [(pytest.approx(1 / 2), 2)] * 2
        assert backs == []

        # Both entries and claims gone: the first to beat does not take the whole replica either.
        await client.delete("{floodgate:evicted}:expiry", "{floodgate:evicted}:claims")
        now[0] += settings.interval_s
        views = [await a.beat_once(), await b.beat_once()]
        assert [(v.share, v.live) for v in views] == [(pytest.approx(1 / 2), 2)] * 2
        assert backs == []
    finally:
        await client.aclose()
