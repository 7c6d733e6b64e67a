"""The fair queue on its own: equal KV-token service, a returning user next in line, and a blocked user
keeps its place."""

from __future__ import annotations

import itertools
import random
from collections import Counter
from dataclasses import dataclass

from edge.admission.fair_queue import FairQueue
from edge.admission.service_rate import ServiceRate
from edge.admission.ticket import Ticket
from tests.admission.flow import ticket


def KV_TOKENS(ticket: Ticket) -> int:
    return ticket.kv_tokens


@dataclass(eq=False)
class Item:
    ticket: Ticket


def serve(queue: FairQueue[Item], n: int) -> list[Item]:
    served = []
    queue.begin_pass()
    for _ in range(n):
        item = queue.next_candidate()
        assert item is not None
        queue.commit(item)
        served.append(item)
    return served


def test_backlogged_users_get_equal_kv_tokens_whatever_their_request_sizes() -> None:
    queue: FairQueue[Item] = FairQueue(cost=KV_TOKENS)
    for _ in range(200):
        queue.push(Item(ticket("big", kv_tokens=512)))
        queue.push(Item(ticket("small", kv_tokens=128)))
    kv: Counter[str] = Counter()
    for item in serve(queue, 100):
        kv[item.ticket.user] += item.ticket.kv_tokens
    assert abs(kv["big"] - kv["small"]) <= 512


def test_a_blocked_user_sits_out_the_pass_and_comes_first_in_the_next() -> None:
    queue: FairQueue[Item] = FairQueue(cost=KV_TOKENS)
    for user in ("a", "b", "c"):
        for _ in range(3):
            queue.push(Item(ticket(user, kv_tokens=200)))
    queue.begin_pass()
    first = queue.next_candidate()
    assert first is not None and first.ticket.user == "a"
    queue.block(first)
    others = []
    while (item := queue.next_candidate()) is not None and len(others) < 4:
        others.append(item.ticket.user)
        queue.commit(item)
    assert "a" not in others

    queue.begin_pass()
    again = queue.next_candidate()
    assert again is first


def test_removed_items_leave_the_queue() -> None:
    queue: FairQueue[Item] = FairQueue(cost=KV_TOKENS)
    gone, stays = Item(ticket("a")), Item(ticket("b"))
    queue.push(gone)
    queue.push(stays)
    assert queue.remove(gone) and not queue.remove(gone)
    assert len(queue) == 1 and queue.queued_by("a") == 0
    assert serve(queue, 1) == [stays]


def test_a_user_whose_queue_emptied_is_next_once_the_other_has_had_one_request() -> None:
    # A closed loop: the light user's next request arrives after its last was served, behind the
    # heavy user's backlog; it goes next all the same, and the two alternate.
    queue: FairQueue[Item] = FairQueue(cost=KV_TOKENS)
    for _ in range(6):
        queue.push(Item(ticket("heavy", kv_tokens=100)))
    queue.push(Item(ticket("light", kv_tokens=100)))
    order = []
    for _ in range(8):
        (item,) = serve(queue, 1)
        order.append(item.ticket.user)
        if item.ticket.user == "light":
            queue.push(Item(ticket("light", kv_tokens=100)))
    assert order == ["heavy", "light"] * 4


def test_an_idle_user_banks_no_credit() -> None:
    queue: FairQueue[Item] = FairQueue(cost=KV_TOKENS)
    for _ in range(20):
        queue.push(Item(ticket("busy", kv_tokens=100)))
    serve(queue, 10)
    for _ in range(5):
        queue.push(Item(ticket("back", kv_tokens=100)))
    # Back after ten of the busy user's requests: one each from then on, not ten in a row.
    served = [item.ticket.user for item in serve(queue, 6)]
    assert served.count("back") == 3 and all(a != b for a, b in itertools.pairwise(served)), served


def test_what_the_queue_remembers_of_gone_users_is_bounded() -> None:
    # A queue that never empties, each request from a user never seen again: the finish tags of
    # 20,000 users, the heap's entries for users removed before they were served, and the users
    # that linger after their request ended.
    queue: FairQueue[Item] = FairQueue(cost=KV_TOKENS)
    queue.push(Item(ticket("stays", kv_tokens=10)))
    for i in range(20_000):
        queue.push(Item(ticket(f"user-{i}", kv_tokens=10)))
        queue.push(cancelled := Item(ticket(f"gone-{i}", kv_tokens=10)))
        assert queue.remove(cancelled)
        (served,) = serve(queue, 1)
        queue.released(served.ticket)
        queue.push(Item(ticket(served.ticket.user, kv_tokens=10)))
    assert len(queue._finish) <= 4096 and len(queue._heap) <= 2 * queue.users_waiting() + 64
    assert len(queue._lingering) <= 64 and len(queue._linger_heap) <= 4096


def test_a_user_whose_request_still_runs_keeps_its_charge() -> None:
    # Its queue empty, its long request running: cancelling and sending again, or simply sending
    # its next, starts where that request finished, behind another user's short ones.
    queue: FairQueue[Item] = FairQueue(cost=KV_TOKENS)
    queue.push(Item(ticket("long", kv_tokens=2000)))
    (running,) = serve(queue, 1)
    queue.push(again := Item(ticket("long", kv_tokens=2000)))
    assert queue.remove(again)
    queue.push(Item(ticket("long", kv_tokens=2000)))
    for _ in range(40):
        queue.push(Item(ticket("short", kv_tokens=100)))
    served = [item.ticket.user for item in serve(queue, 41)]
    assert served.index("long") >= 10, served
    queue.released(running.ticket)


def test_service_time_forgets_its_prior_at_the_first_completion() -> None:
    rate = ServiceRate(prior_service_s=10.0, alpha=0.2)
    assert rate.completions_per_s(in_flight=4) == 0.4
    rate.observe(2.0)
    assert rate.service_s == 2.0
    rate.observe(4.0)
    assert rate.service_s == 3.0
    assert rate.completions_per_s(in_flight=6) == 2.0


def test_backlog_within_counts_at_most_so_many_per_user() -> None:
    queue: FairQueue[Item] = FairQueue(cost=KV_TOKENS)
    items = [Item(ticket(user)) for user, n in (("a", 5), ("b", 2), ("c", 1)) for _ in range(n)]
    for item in items:
        queue.push(item)
    assert queue.backlog_within(1) == 3
    assert queue.backlog_within(2) == 5
    assert queue.backlog_within(10) == 8
    queue.remove(items[0])
    serve(queue, 1)
    assert queue.backlog_within(10) == 6 and len(queue) == 6
    assert queue.reserve_items == 0


def test_after_an_idle_spell_nobody_is_owed_anything() -> None:
    # A's long request ended beside B's short one, then nothing waited or ran: A's next request is
    # not held behind B's for the long one (it was, behind 114 of them, while A "lingered").
    queue: FairQueue[Item] = FairQueue(cost=KV_TOKENS)
    queue.push(Item(ticket("A", kv_tokens=8192)))
    queue.push(Item(ticket("B", kv_tokens=100)))
    long, short = serve(queue, 2)
    queue.released(short.ticket)
    queue.released(long.ticket)
    for _ in range(5):
        queue.push(Item(ticket("B", kv_tokens=100)))
    queue.push(Item(ticket("A", kv_tokens=100)))
    assert [item.ticket.user for item in serve(queue, 6)].index("A") <= 1


def test_lingering_users_are_bounded_and_a_stray_release_changes_nothing() -> None:
    queue: FairQueue[Item] = FairQueue(cost=KV_TOKENS)
    queue.push(Item(ticket("stays", kv_tokens=10)))
    serve(queue, 1)  # running for good: the tier never goes idle
    for i in range(20_000):
        queue.push(Item(ticket(f"user-{i}", kv_tokens=10_000)))
        (served,) = serve(queue, 1)
        queue.released(served.ticket)
        queue.released(served.ticket)  # told twice: ignored
    assert len(queue._lingering) <= 4096 and queue._active == len(queue._lingering) + 1


def test_a_returning_users_lead_is_reckoned_without_pricing_every_waiting_user() -> None:
    """With nothing of its tier running (a higher tier holding every place), a returning user's lead
    was reckoned from the price of every waiting user's next request, each priced again for every
    request that asked: with the tier's 1,000 users queued, each new request of such a user (and
    each refusal's Retry-After) cost 1.4 ms of the event loop, in the overload that refuses most."""
    priced = 0

    def counted(ticket: Ticket) -> int:
        nonlocal priced
        priced += 1
        return ticket.kv_tokens

    queue: FairQueue[Item] = FairQueue(cost=counted)
    served = ticket("back", kv_tokens=1024)
    queue.placed_at_once(served)
    for n in range(1000):
        queue.push(Item(ticket(f"waiting-{n}", kv_tokens=1024)))
    queue.released(served)  # ended: nothing of the tier runs, and its user is ahead of V
    returning = ticket("back", kv_tokens=1024)
    priced = 0
    assert queue.lead_waits(returning) == 1000  # every other active user goes first once
    assert priced <= 1


def test_the_waiting_users_next_prices_follow_pushes_dispatches_and_withdrawals() -> None:
    """The next requests' prices, kept as heads change rather than reckoned on each ask, stay those
    of the requests next in line through every way a queue's head changes."""
    rng = random.Random(7)
    queue: FairQueue[Item] = FairQueue(cost=KV_TOKENS)
    waiting: list[Item] = []
    for _ in range(2000):
        op = rng.random()
        if op < 0.5 or not waiting:
            item = Item(ticket(f"u{rng.randrange(20)}", kv_tokens=rng.randrange(1, 4000)))
            queue.push(item)
            waiting.append(item)
        elif op < 0.75:
            gone = waiting.pop(rng.randrange(len(waiting)))
            assert queue.remove(gone)
        else:
            queue.begin_pass()
            item = queue.next_candidate()
            assert item is not None
            queue.commit(item)
            waiting.remove(item)
            queue.released(item.ticket)
        heads = {}
        for item in waiting:
            heads.setdefault(item.ticket.user, item.ticket.kv_tokens)
        expected = sum(heads.values()) / len(heads) if heads else None
        if expected is not None:
            assert queue._cost_per_end(ticket("other")) == expected
