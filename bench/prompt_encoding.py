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
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from bench.__main__ import machine
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


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.prompt_encoding")
    parser.add_argument("--turns", default="1,2,5,10,20")
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--model-dir", type=Path, default=None, help="default: the imported SmolLM2")
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


if __name__ == "__main__":
    main()
