"""A chat's prompt encoding turn by turn, with the edge's kept pieces and without, same run.

python -m bench.prompt_encoding [--turns 1,2,5,10,20] [--repeat 200] [--model-dir DIR] [--json]

A chat sends its whole history with every turn: the system prompt, every earlier message and reply,
then the new message. Without a cache the edge re-encodes all of it every turn; with
edge/text/piece_cache.py only the pieces it has not seen (the last reply and the new message). The
conversation's text is this repository's own prose (README and docs, English with code and
numbers), cut into a 600-character system prompt, 300-character user messages and 900-character
replies. Printed per turn: prompt tokens, CPU µs per request for each (the process's CPU time,
every thread's: the tokenizer may encode on threads of its own; the median of `--repeat` encodes),
and their ratio. Before each timed encode with kept pieces the cache is
emptied and the turn before is encoded, as its own request would have: the last reply and the new
message are new (turn 1: every piece is new, the cache's cost on a miss).

Then, for one new message of each of `--stall-sizes` characters (nothing of it kept), how long the
event loop stood still while the edge encoded it (`encode_messages`, edge/prompt_encoding.py: on
the loop below its inline limit, on a worker thread above), with the limit before (16,384) and
today's, alternating: the longest lateness of a 0.5 ms timer on the loop, and the process's CPU.
Every stream's next token waits that long.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path

from bench.__main__ import machine
from edge import prompt_encoding
from edge.text.model_text import ModelText

SYSTEM_CHARS, USER_CHARS, REPLY_CHARS = 600, 300, 900


def _prose() -> str:
    root = Path(__file__).resolve().parent.parent
    sources = [root / "README.md", *sorted((root / "docs").glob("*.md"))]
    return " ".join(" ".join(p.read_text().split()) for p in sources)


def conversation(turns: int) -> list[dict[str, str]]:
    """The messages of turn `turns`: the system prompt, `turns - 1` exchanges, the new message."""
    prose = _prose()
    at = 0

    def take(n: int) -> str:
        nonlocal at
        piece, at = prose[at : at + n], at + n
        return piece

    messages = [{"role": "system", "content": take(SYSTEM_CHARS)}]
    for _ in range(turns - 1):
        messages.append({"role": "user", "content": take(USER_CHARS)})
        messages.append({"role": "assistant", "content": take(REPLY_CHARS)})
    messages.append({"role": "user", "content": take(USER_CHARS)})
    return messages


Messages = list[dict[str, str]]


def _cpu_us(text: ModelText, messages: Messages, before: Messages, repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        if text._piece_cache is not None:
            text._piece_cache.clear()
            if before:
                text.encode_chat(before, "user")
        start = time.process_time_ns()
        text.encode_chat(messages, "user")
        samples.append((time.process_time_ns() - start) / 1e3)
    return statistics.median(samples)


# edge/prompt_encoding.py's inline limit before this pass.
INLINE_LIMIT_BEFORE = 16_384


async def _stall(text: ModelText, messages: Messages, limit: int) -> tuple[float, float]:
    """(ms the loop stood still at most, µs of CPU) while encode_messages encoded `messages`, new
    to the cache, under inline limit `limit`."""
    if text._piece_cache is not None:
        text._piece_cache.clear()
    loop = asyncio.get_running_loop()
    late: list[float] = []
    done = asyncio.Event()

    async def tick() -> None:
        while not done.is_set():
            due = loop.time() + 0.0005
            await asyncio.sleep(0.0005)
            late.append(loop.time() - due)

    ticker = asyncio.create_task(tick())
    await asyncio.sleep(0.002)
    saved, prompt_encoding.INLINE_COST_LIMIT = prompt_encoding.INLINE_COST_LIMIT, limit
    try:
        start = time.process_time_ns()
        await prompt_encoding.encode_messages(text.encode_chat, messages, "user")
        cpu_us = (time.process_time_ns() - start) / 1e3
    finally:
        prompt_encoding.INLINE_COST_LIMIT = saved
    done.set()
    await ticker
    return max(late) * 1e3, cpu_us


def _stall_row(text: ModelText, chars: int, repeat: int) -> dict[str, object]:
    messages = [{"role": "user", "content": _prose()[:chars]}]
    limits = {"before": INLINE_LIMIT_BEFORE, "now": prompt_encoding.INLINE_COST_LIMIT}
    stalls: dict[str, list[float]] = {name: [] for name in limits}
    cpus: dict[str, list[float]] = {name: [] for name in limits}
    for round_ in range(repeat):
        names = list(limits) if round_ % 2 == 0 else list(limits)[::-1]
        for name in names:
            stall, cpu = asyncio.run(_stall(text, messages, limits[name]))
            stalls[name].append(stall)
            cpus[name].append(cpu)
    row: dict[str, object] = {"new_prompt_chars": chars}
    for name in limits:
        row[f"loop_stall_ms_{name}"] = round(statistics.median(stalls[name]), 2)
        row[f"cpu_us_{name}"] = round(statistics.median(cpus[name]), 1)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.prompt_encoding")
    parser.add_argument("--turns", default="1,2,5,10,20")
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--model-dir", type=Path, default=None, help="default: the imported SmolLM2")
    parser.add_argument("--stall-sizes", default="1024,4096,8192,16000", help="new message characters")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    model_dir = args.model_dir
    if model_dir is None:
        (model_dir,) = Path(".floodgate/models").glob("smollm2-135m-instruct-*")
    print(f"machine: {machine()}; model: {model_dir.name}", flush=True)
    kept = ModelText.load(model_dir)
    whole = ModelText.load(model_dir)
    whole._piece_cache = None  # the edge's encoding before edge/text/piece_cache.py
    for turns in (int(t) for t in args.turns.split(",")):
        messages = conversation(turns)
        previous = conversation(turns - 1) if turns > 1 else []
        ids = whole.encode_chat(messages)
        assert kept.encode_chat(messages, "user") == ids
        before = _cpu_us(whole, messages, [], args.repeat)
        after = _cpu_us(kept, messages, previous, args.repeat)
        row = {
            "turn": turns,
            "prompt_tokens": len(ids),
            "whole_us": round(before, 1),
            "kept_pieces_us": round(after, 1),
            "ratio": round(after / before, 3),
        }
        print(json.dumps(row) if args.json else row, flush=True)
    for chars in (int(c) for c in args.stall_sizes.split(",") if c):
        stall = _stall_row(kept, chars, max(5, args.repeat // 10))
        print(json.dumps(stall) if args.json else stall, flush=True)


if __name__ == "__main__":
    main()
