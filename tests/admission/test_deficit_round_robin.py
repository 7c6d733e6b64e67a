"""Deficit round robin on its own: equal KV-token service, and a blocked user keeps its place."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from edge.admission.deficit_round_robin import DeficitRoundRobin
from edge.admission.service_rate import ServiceRate
from edge.admission.ticket import Ticket
from tests.admission.flow import ticket


def KV_TOKENS(ticket: Ticket) -> int:
    return ticket.kv_tokens


@dataclass(eq=False)
class Item:
    ticket: Ticket


def serve(drr: DeficitRoundRobin[Item], n: int) -> list[Item]:
    served = []
    drr.begin_pass()
    for _ in range(n):
        item = drr.next_candidate()
        assert item is not None
        drr.commit(item)
        served.append(item)
    return served


def test_backlogged_users_get_equal_kv_tokens_whatever_their_request_sizes() -> None:
    drr: DeficitRoundRobin[Item] = DeficitRoundRobin(quantum=256, cost=KV_TOKENS)
    for _ in range(200):
        drr.push(Item(ticket("big", kv_tokens=512)))
        drr.push(Item(ticket("small", kv_tokens=128)))
    kv: Counter[str] = Counter()
    for item in serve(drr, 100):
        kv[item.ticket.user] += item.ticket.kv_tokens
    assert abs(kv["big"] - kv["small"]) <= 512


def test_a_blocked_user_sits_out_the_pass_and_comes_first_in_the_next() -> None:
    drr: DeficitRoundRobin[Item] = DeficitRoundRobin(quantum=256, cost=KV_TOKENS)
    for user in ("a", "b", "c"):
        for _ in range(3):
            drr.push(Item(ticket(user, kv_tokens=200)))
    drr.begin_pass()
    first = drr.next_candidate()
    assert first is not None and first.ticket.user == "a"
    drr.block(first)
    others = []
    while (item := drr.next_candidate()) is not None and len(others) < 4:
        others.append(item.ticket.user)
        drr.commit(item)
    assert "a" not in others

    drr.begin_pass()
    again = drr.next_candidate()
    assert again is first


def test_removed_items_leave_the_queue_and_an_emptied_user_leaves_the_ring() -> None:
    drr: DeficitRoundRobin[Item] = DeficitRoundRobin(quantum=256, cost=KV_TOKENS)
    gone, stays = Item(ticket("a")), Item(ticket("b"))
    drr.push(gone)
    drr.push(stays)
    assert drr.remove(gone) and not drr.remove(gone)
    assert len(drr) == 1 and drr.queued_by("a") == 0
    assert serve(drr, 1) == [stays]


def test_service_time_forgets_its_prior_at_the_first_completion() -> None:
    rate = ServiceRate(prior_service_s=10.0, alpha=0.2)
    assert rate.completions_per_s(in_flight=4) == 0.4
    rate.observe(2.0)
    assert rate.service_s == 2.0
    rate.observe(4.0)
    assert rate.service_s == 3.0
    assert rate.completions_per_s(in_flight=6) == 2.0


def test_backlog_within_counts_at_most_so_many_per_user() -> None:
    drr: DeficitRoundRobin[Item] = DeficitRoundRobin(quantum=256, cost=KV_TOKENS)
    items = [Item(ticket(user)) for user, n in (("a", 5), ("b", 2), ("c", 1)) for _ in range(n)]
    for item in items:
        drr.push(item)
    assert drr.backlog_within(1) == 3
    assert drr.backlog_within(2) == 5
    assert drr.backlog_within(10) == 8
    drr.remove(items[0])
    serve(drr, 1)
    assert drr.backlog_within(10) == 6 and len(drr) == 6
    assert drr.reserve_items == 0
