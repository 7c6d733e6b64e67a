"""Fairness between chat clients on a real edge: a user with one closed loop beside a user with
several, sharing one place (a CPU engine of one sequence), as the admission queue's fair queueing
between a tier's users must share it.

    python -m bench.closed_loop_fairness [--loops 2,8] [--replies 120] [--json]

A closed loop sends its next request as its last reply ends (a chat client, the OpenAI SDK in a
loop). With one place and requests alike, the one-loop user can hold the place at most every other
time, and fairness is exactly that: a share of 0.5 of the replies. Deficit round robin gave it 0.33
beside 2 loops and 0.12 beside 8 (docs/benchmarks.md); the fair queue (edge/admission/fair_queue.py)
about 0.47 for both.
"""

from __future__ import annotations

import argparse
import asyncio
import json

import httpx

from bench.edge_server import edge_process

ONE_PLACE = '[engine]\nmax_num_seqs = 1\nisolation = "thread"\n'
BODY = {
    "model": "floodgate-tiny",
    "messages": [{"role": "user", "content": "hi"}],
    "max_tokens": 16,
    "stream": True,
}


async def _loop(
    client: httpx.AsyncClient, key: str, user: str, replies: dict[str, int], wanted: int, done: asyncio.Event
) -> None:
    while not done.is_set():
        headers = {"Authorization": f"Bearer {key}"}
        async with client.stream("POST", "/v1/chat/completions", json=BODY, headers=headers) as response:
            async for _ in response.aiter_lines():
                pass
            if response.status_code != 200:
                raise RuntimeError(f"{user}: HTTP {response.status_code}")
        replies[user] += 1
        if sum(replies.values()) >= wanted:
            done.set()


async def measure(heavy_loops: int, wanted: int) -> dict[str, object]:
    """Replies to each user until `wanted` in all, on a fresh edge."""
    with edge_process(ONE_PLACE, users=("heavy", "light")) as edge:
        replies = {"heavy": 0, "light": 0}
        done = asyncio.Event()
        limits = httpx.Limits(max_connections=heavy_loops + 1)
        async with httpx.AsyncClient(base_url=edge.base_url, timeout=60.0, limits=limits) as client:
            loops = [
                _loop(client, edge.keys["heavy"], "heavy", replies, wanted, done) for _ in range(heavy_loops)
            ]
            await asyncio.gather(*loops, _loop(client, edge.keys["light"], "light", replies, wanted, done))
    return {
        "heavy_loops": heavy_loops,
        "light_loops": 1,
        "replies": replies,
        "light_share": round(replies["light"] / sum(replies.values()), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--loops", default="2,8", help="the heavy user's closed loops, one run each")
    parser.add_argument("--replies", type=int, default=120, help="replies per run, both users together")
    parser.add_argument("--json", action="store_true", help="one JSON object per run")
    args = parser.parse_args()
    for loops in (int(n) for n in args.loops.split(",")):
        row = asyncio.run(measure(loops, args.replies))
        if args.json:
            print(json.dumps(row))
        else:
            replies = row["replies"]
            assert isinstance(replies, dict)
            print(
                f"1 loop beside {loops}: {replies['light']} and {replies['heavy']} replies, "
                f"one-loop share {row['light_share']} (fair: 0.5)"
            )


if __name__ == "__main__":
    main()
