"""Each replica divided among a few members ([fleet] members_per_replica): the arithmetic
(edge/membership/assignment.py, shares.py), and one member's real membership loop on a real
redis-server taking a replica it newly ranks on only once the others there made room."""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys

import pytest
from prometheus_client import REGISTRY

from edge.admission.dispatcher import Dispatcher
from edge.membership import assignment
from edge.membership.assignment import Rankings
from edge.membership.edge_fleet import apply_view
from edge.membership.membership import FleetMembership, MembershipSettings
from edge.membership.registry import MembershipRegistry
from edge.membership.shares import FleetView, view_from_claims
from limiter import redis_url
from tests.admission.replicas import ControlledUpstream
from tests.support.redis_server import RedisServer

REPLICAS = [f"10.0.{i // 256}.{i % 256}:8001" for i in range(40)]


def _members(n: int, seed: int = 7) -> list[str]:
    rng = random.Random(seed)
    return [f"ip-10-1-{i}:{rng.randrange(1, 1 << 22)}:{rng.getrandbits(32):08x}" for i in range(n)]


def assigned(members: list[str] | dict[str, float], replica: str, k: int) -> frozenset[str]:
    """The members that divide `replica`, ranked afresh."""
    rankings = Rankings()
    rankings.rank(members)
    return frozenset(rankings.top(frozenset(members), replica, k))


@pytest.mark.parametrize(("n", "k"), [(300, 30), (5, 3), (2, 3), (1, 1), (12, 0)])
def test_each_replica_goes_to_k_members_whose_parts_sum_to_at_most_the_replica(n: int, k: int) -> None:
    rng = random.Random(n * 100 + k)
    # Some drain (a claim falling to 0), the rest serve or join (a full claim).
    claims = {m: rng.choice([1.0, 1.0, 1.0, rng.random(), 0.0]) for m in _members(n)}
    views = {m: view_from_claims(claims, m, "serving", members_per_replica=k) for m in claims}
    for replica in REPLICAS:
        members = assigned(claims, replica, k)
        assert len(members) == (n if k == 0 else min(k, n))
        parts = {m: views[m].held_of(replica) for m in claims}
        assert all(parts[m] == 0.0 for m in claims if m not in members)
        assert sum(parts.values()) <= 1.0 + 1e-9
        if any(claims[m] > 0 for m in members):
            assert sum(parts.values()) == pytest.approx(1.0)


def test_without_a_limit_every_member_fills_its_claim_over_all_claims() -> None:
    claims = dict(zip(_members(4), [1.0, 1.0, 0.5, 1.0], strict=True))
    for member, claim in claims.items():
        view = view_from_claims(claims, member, "serving", members_per_replica=0)
        assert view.subsets is None
        assert all(view.held_of(r) == pytest.approx(claim / 3.5) for r in REPLICAS)


def test_a_member_leaving_moves_only_the_replicas_it_was_on() -> None:
    members = _members(60)
    before = {r: assigned(members, r, 5) for r in REPLICAS}
    gone = members[17]
    after = {r: assigned([m for m in members if m != gone], r, 5) for r in REPLICAS}
    for replica in REPLICAS:
        if gone in before[replica]:
            # Its place goes to one other member; the rest stay.
            assert len(after[replica] - before[replica]) == 1
            assert before[replica] - after[replica] == {gone}
        else:
            assert after[replica] == before[replica]
    # And one joining takes places only: nobody else moves but the one it displaces on each.
    joined = [*members, "ip-10-9-9:4242:0badcafe"]
    for replica in REPLICAS:
        now = assigned(joined, replica, 5)
        assert now == before[replica] or (
            len(now - before[replica]) == 1 and "ip-10-9-9:4242:0badcafe" in now
        )


def test_every_process_computes_the_same_members_per_replica() -> None:
    """Python's hash() is salted per process: the weights must not depend on it."""
    members = _members(50)
    mine = {r: sorted(assigned(members, r, 4)) for r in REPLICAS}
    code = (
        "import json, sys\n"
        "from edge.membership.assignment import Rankings\n"
        "members, replicas = json.load(sys.stdin)\n"
        "rankings = Rankings()\n"
        "rankings.rank(members)\n"
        "print(json.dumps({r: sorted(rankings.top(set(members), r, 4)) for r in replicas}))\n"
    )
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run(
            [sys.executable, "-c", code],
            input=json.dumps([members, REPLICAS]),
            capture_output=True,
            text=True,
            env=env,
            check=True,
        ).stdout
        assert json.loads(out) == mine


def test_a_replica_newly_ranked_on_is_settled_only_once_every_recent_set_ranks_it() -> None:
    members = _members(8)
    replica = REPLICAS[0]
    (top,) = assigned(members, replica, 1)
    (second,) = assigned([m for m in members if m != top], replica, 1)
    without_top = frozenset(m for m in members if m != top)
    claims = dict.fromkeys(without_top, 1.0)
    before_and_after = (frozenset(members), without_top)
    assert view_from_claims(claims, second, "serving", (), 1, before_and_after).held_of(replica) == 0.0
    assert view_from_claims(claims, second, "serving", (), 1, (without_top,)).held_of(replica) == 1.0


@pytest.mark.anyio
async def test_a_member_takes_a_replica_it_newly_ranks_on_after_a_join_wait(
    redis_server: RedisServer,
) -> None:
    """K = 1: member b ranks second on the replica, behind a. a leaves: b is now the replica's one
    member, but a's peers may not have seen a go yet, so b takes it only a join wait later (a's
    part of it fell with its streams while it drained; the others grew into it). A replica b is
    not among stays 0; the limiter's divisor still counts every member."""
    # Steps exact in binary: the clock lands on the join wait's end itself, not a float's width short.
    settings = MembershipSettings(
        interval_s=0.25, join_wait_s=0.5, ttl_s=60, fleet="subsets", members_per_replica=1
    )
    client = redis_url.connect(redis_server.url)
    registry = MembershipRegistry(client, settings.fleet, quiet_s=settings.quiet_s)
    a, b = "host:1:aaaa1111", "host:2:bbbb2222"
    # A replica that ranks a over b, and one that ranks b over a.
    on_a = next(r for r in REPLICAS if assigned([a, b], r, 1) == {a})
    on_b = next(r for r in REPLICAS if assigned([a, b], r, 1) == {b})
    now = [0.0]
    member = FleetMembership(client, b, settings, clock=lambda: now[0])
    try:
        await registry.beat(a, 1.0, ttl_s=60)
        joining = await member.beat_once()
        assert joining.held_of(on_a) == joining.held_of(on_b) == 0.0  # a joiner holds nothing
        now[0] += settings.join_wait_s
        serving = await member.beat_once()
        assert (serving.held_of(on_a), serving.held_of(on_b), serving.divisor) == (0.0, 1.0, 2)

        await registry.leave(a)
        now[0] += settings.interval_s
        gained = await member.beat_once()
        assert (gained.held_of(on_a), gained.held_of(on_b), gained.divisor) == (0.0, 1.0, 1)
        now[0] += settings.interval_s
        assert (await member.beat_once()).held_of(on_a) == 0.0
        now[0] += settings.interval_s
        assert (await member.beat_once()).held_of(on_a) == 1.0
    finally:
        await client.aclose()


@pytest.mark.anyio
async def test_a_view_after_one_member_changed_ranks_each_replica_anew_only_for_that_member(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The view is applied on the edge's one event loop at every change of the members. Ranking
    every live member for every replica of every model under every recent member set made each
    view cost members x replicas x sets weights (115 ms at 300 members, 300 replicas): a member
    joining and one leaving now cost a couple of weights per replica, whatever the fleet's size."""
    settings = MembershipSettings(
        interval_s=0.25, join_wait_s=0.5, ttl_s=60, fleet="cost", members_per_replica=5
    )
    client = redis_url.connect(redis_server.url)
    registry = MembershipRegistry(client, settings.fleet, quiet_s=settings.quiet_s)
    others = _members(60)
    models = [[ControlledUpstream(f"m{d}-{r}") for r in REPLICAS] for d in range(2)]
    dispatchers = [Dispatcher(u, reserved_paid_fraction=0.1, max_queue=10) for u in models]
    replicas = sum(len(d.upstream_names()) for d in dispatchers)
    now = [0.0]
    member = FleetMembership(
        client, "ip-10-2-0:1:0000abcd", settings, apply_view(dispatchers, None), clock=lambda: now[0]
    )
    weights = [0]

    def counted(member: str, replica: str) -> int:
        weights[0] += 1
        return real(member, replica)

    real = assignment.weight
    monkeypatch.setattr(assignment, "weight", counted)
    try:
        for other in others:
            await registry.beat(other, 1.0, ttl_s=60)
        await member.beat_once()
        now[0] += settings.join_wait_s
        assert (await member.beat_once()).share > 0  # serving: every replica ranked once
        await registry.leave(others[0])
        await registry.beat("ip-10-9-9:4242:0badcafe", 1.0, ttl_s=60)
        weights[0] = 0
        now[0] += settings.interval_s
        changed = await member.beat_once()
        assert changed.live == len(others) + 1
        assert weights[0] <= 2 * replicas, weights[0]
    finally:
        await client.aclose()


@pytest.mark.anyio
async def test_a_replica_discovered_after_the_view_counts_in_the_replicas_filled_gauge(
    redis_server: RedisServer,
) -> None:
    """floodgate_fleet_replicas_filled is what an operator alerts on (0: this process answers every
    request no_replica). Set only when a view was applied, it stayed at what the dispatchers held
    then: replicas discovered later (asg:, a scale from zero) never counted until the fleet next
    changed, which in a steady fleet may be never, so every edge read 0 while serving."""
    settings = MembershipSettings(
        interval_s=0.25, join_wait_s=0.5, ttl_s=60, fleet="filled", members_per_replica=1
    )
    client = redis_url.connect(redis_server.url)
    registry = MembershipRegistry(client, settings.fleet, quiet_s=settings.quiet_s)
    me, other = "host:1:aaaa1111", "host:2:bbbb2222"
    on_me = next(r for r in REPLICAS if assigned([me, other], r, 1) == {me})
    on_other = next(r for r in REPLICAS if assigned([me, other], r, 1) == {other})
    dispatcher = Dispatcher([ControlledUpstream(on_other)], reserved_paid_fraction=0.1, max_queue=10)
    now = [0.0]
    member = FleetMembership(client, me, settings, apply_view([dispatcher], None), clock=lambda: now[0])
    try:
        await registry.beat(other, 1.0, ttl_s=60)
        await member.beat_once()
        now[0] += settings.join_wait_s
        assert (await member.beat_once()).share > 0
        assert REGISTRY.get_sample_value("floodgate_fleet_replicas_filled") == 0.0
        await dispatcher.add_upstream(ControlledUpstream(on_me))
        assert REGISTRY.get_sample_value("floodgate_fleet_replicas_filled") == 1.0
    finally:
        await dispatcher.aclose()
        await client.aclose()


@pytest.mark.anyio
async def test_with_redis_out_of_reach_past_stale_after_each_replica_stays_among_its_members(
    redis_server: RedisServer,
) -> None:
    """Redis unreachable past stale_after_s, the fallback divided every replica among
    instance_count again: each process filled 1 / instance_count of every replica (with the
    hundreds of processes K is for, a few thousand tokens each), so for the whole outage a request
    past that fitted no process anywhere, answered no_replica, the wall members_per_replica
    removes. A process that served keeps each replica's division among its members as it last saw
    them (the others, cut off too, keep theirs: the same division); instance_count still divides
    the limits."""
    settings = MembershipSettings(
        instance_count=4, interval_s=0.25, join_wait_s=0.5, ttl_s=60, stale_after_s=1.0,
        fleet="fallback", members_per_replica=1,
    )  # fmt: skip
    client = redis_url.connect(redis_server.url)
    registry = MembershipRegistry(client, settings.fleet, quiet_s=settings.quiet_s)
    a, b = "host:1:aaaa1111", "host:2:bbbb2222"
    on_a = next(r for r in REPLICAS if assigned([a, b], r, 1) == {a})
    on_b = next(r for r in REPLICAS if assigned([a, b], r, 1) == {b})
    now = [0.0]
    member = FleetMembership(client, b, settings, clock=lambda: now[0])
    try:
        await registry.beat(a, 1.0, ttl_s=60)
        await member.beat_once()
        now[0] += settings.join_wait_s
        serving = await member.beat_once()
        assert (serving.held_of(on_a), serving.held_of(on_b)) == (0.0, 1.0)
        redis_server.kill()
        now[0] += settings.stale_after_s
        fallback = await member.beat_once()
        assert (fallback.source, fallback.divisor) == ("fallback", 4)
        assert (fallback.held_of(on_a), fallback.held_of(on_b)) == (0.0, 1.0)
    finally:
        await client.aclose()


@pytest.mark.anyio
async def test_a_member_whose_join_wait_ends_with_redis_out_of_reach_keeps_joining(
    redis_server: RedisServer,
) -> None:
    """The join wait stands for every other member having beaten since this one's first beat, and
    made room: with Redis out of reach nobody could. A joiner whose wait ran out then took its part
    of its replicas anyway, from the fleet its first beat read, beside the members still holding
    them whole; past stale_after_s it kept that division for the whole outage (each replica it ranks
    on filled twice over, K = 1 here). It stays joining until a beat reaches Redis: past
    stale_after_s it fills 1 / instance_count of every replica, as a process that never served."""
    settings = MembershipSettings(
        instance_count=4, interval_s=0.25, join_wait_s=0.5, ttl_s=60, stale_after_s=1.0,
        fleet="join-outage", members_per_replica=1,
    )  # fmt: skip
    client = redis_url.connect(redis_server.url)
    registry = MembershipRegistry(client, settings.fleet, quiet_s=settings.quiet_s)
    a, b = "host:1:aaaa1111", "host:2:bbbb2222"
    on_b = next(r for r in REPLICAS if assigned([a, b], r, 1) == {b})
    views: asyncio.Queue[FleetView] = asyncio.Queue()
    now = [0.0]
    member = FleetMembership(client, b, settings, views.put_nowait, clock=lambda: now[0])

    async def next_view(source: str) -> FleetView:
        while (view := await asyncio.wait_for(views.get(), timeout=30)).source != source:
            pass
        return view

    try:
        await registry.beat(a, 1.0, ttl_s=60)
        assert (await member.start()).share == 0.0  # joining: a was there first
        redis_server.kill()
        assert (await next_view("stale")).share == 0.0  # the loop's next beat found Redis gone
        now[0] += settings.stale_after_s  # the join wait over, and the last beat stale
        fallback = await next_view("fallback")
        assert fallback.held_of(on_b) == 0.25
    finally:
        await member.aclose()
        await client.aclose()
