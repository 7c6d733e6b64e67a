"""Plots of bench.streams runs side by side (docs/bench-streams.md).

python -m bench.streams_plot LABEL=FILE.jsonl [LABEL=FILE.jsonl#TREE ...] -o docs/bench-streams.png

Each FILE holds the JSON lines of one `python -m bench.streams --json` run; `#TREE` keeps the rows of
one tree of a `--trees` or `--bare` run (`#bare`: the floor). Runs are matched by (upstream,
workers, pacing, streams, replicas); the floor's rows count under the upstream they stand under.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

PANELS = [
    ("cpu_us_per_token", "server CPU µs per token"),
    ("setup_cpu_ms_per_stream", "set-up CPU ms per stream"),
    ("itl_p99_ms", "inter-token p99 ms"),
]


def _key(row: dict[str, Any]) -> str:
    replicas = "each token alone" if row["replicas"] == row["streams"] else f"{row['replicas']} step clock(s)"
    upstream = row.get("upstream", "in-process").removeprefix("bare-")
    return f"{upstream}, {row['workers']}w\n{row['interval_ms']:g} ms × {row['streams']}\n{replicas}"


def plot(runs: dict[str, list[dict[str, Any]]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = list(dict.fromkeys(_key(r) for rows in runs.values() for r in rows))
    fig, axes = plt.subplots(len(PANELS), 1, figsize=(max(8, 1.6 * len(keys)), 3.2 * len(PANELS)))
    width = 0.8 / len(runs)
    for ax, (field, title) in zip(axes, PANELS, strict=True):
        for i, (label, rows) in enumerate(runs.items()):
            by_key = {_key(r): r[field] for r in rows}
            xs = [k + i * width for k in range(len(keys))]
            ax.bar(xs, [by_key.get(k, 0.0) for k in keys], width, label=label)
        ax.set_title(title)
        ax.set_xticks([k + width * (len(runs) - 1) / 2 for k in range(len(keys))], keys, fontsize=7)
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend()
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.streams_plot")
    parser.add_argument("runs", nargs="+", help="LABEL=FILE.jsonl")
    parser.add_argument("-o", "--out", type=Path, required=True)
    args = parser.parse_args()
    plot(load_runs(args.runs), args.out)


def load_runs(specs: list[str]) -> dict[str, list[dict[str, Any]]]:
    """Each `LABEL=FILE[#TREE]`'s rows, by label."""
    runs = {}
    for spec in specs:
        label, source = spec.split("=", 1)
        path, _, tree = source.partition("#")
        rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
        runs[label] = [r for r in rows if not tree or r.get("tree") == tree]
    return runs


if __name__ == "__main__":
    main()
