"""What matching stop strings costs the edge per token (edge/text/stops.py), in checkouts side by side.

python -m bench.stop_strings [--trees before=DIR,after=.] [--rounds 3]

For each stop-string set, a reply of 500 one-word tokens of prose goes through a StopMatcher one
token a feed (as the relay feeds it), timed over many replies: µs per feed. Then the worst token:
a 16,000-character stop string the reply follows to its last character and then leaves, the one
feed that leaves it timed (the event loop stands still that long). Each tree runs in a process of
its own, on its own code, the trees taking turns each round.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
from pathlib import Path

from bench.__main__ import machine
from bench.trees import parse_trees, tree_python

STOP_SETS = {
    "none": [],
    "two short": ["\n\n", "User:"],
    "one tag": ["</answer>"],
    "four, agent style": ["\nObservation:", "\n\nQuestion:", "###", "END"],
}

_MEASURE = """
import json, sys, time, timeit
from edge.text.stops import StopMatcher
sets = json.loads(sys.argv[1])
words = " The quick brown fox jumps over the lazy dog and".split(" ")
tokens = [" " + w for w in words] * 50
row = {}
for name, stops in sets.items():
    def reply():
        matcher = StopMatcher(stops)
        for count, token in enumerate(tokens, 1):
            matcher.feed(token, count)
    replies = 200
    row[name] = timeit.timeit(reply, number=replies) / replies / len(tokens) * 1e6
stop = "ab" * 8000 + "Z"
matcher = StopMatcher([stop])
for i in range(0, len(stop) - 1, 4):
    matcher.feed(stop[i : min(i + 4, len(stop) - 1)], 1 + i // 4)
started = time.perf_counter()
matcher.feed("Q", 10**6)
row["worst token, 16,000-character stop (ms)"] = (time.perf_counter() - started) * 1e3
print(json.dumps(row))
"""


def _measure(tree: Path | None) -> dict[str, float]:
    out = subprocess.run(
        [tree_python(tree), "-c", _MEASURE, json.dumps(STOP_SETS)],
        cwd=tree,
        env={**os.environ, "PYTHONPATH": str(tree)} if tree else None,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    row: dict[str, float] = json.loads(out)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.stop_strings")
    parser.add_argument(
        "--trees", default="", help="LABEL=DIR,...: checkouts side by side (default: this one)"
    )
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    trees = parse_trees(args.trees) or [("this", None)]
    print(f"machine: {machine()}; µs per feed of one token, then the worst token in ms", flush=True)
    for index in range(args.rounds):
        for label, tree in trees:
            row = {"tree": label, "round": index, **{k: round(v, 3) for k, v in _measure(tree).items()}}
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
