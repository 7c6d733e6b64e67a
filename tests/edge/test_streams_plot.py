"""bench.streams_plot's reading of a paired run: one file, one label per tree, the floor's rows under
the upstream they stand under, and a plot written from them."""

from __future__ import annotations

import json
from pathlib import Path

from bench.streams_plot import _key, load_runs, plot


def _row(tree: str, upstream: str, cpu: float) -> dict[str, object]:
    return {
        "tree": tree,
        "upstream": upstream,
        "workers": 1,
        "interval_ms": 33.0,
        "streams": 200,
        "replicas": 1,
        "cpu_us_per_token": cpu,
        "setup_cpu_ms_per_stream": 0.5,
        "itl_p99_ms": 40.0,
    }


def test_a_paired_run_splits_by_tree_and_the_floor_stands_under_its_upstream(tmp_path: Path) -> None:
    run = tmp_path / "paired.jsonl"
    rows = [
        _row("before", "triton", 66.0),
        _row("after", "triton", 61.4),
        _row("bare", "bare-triton", 33.2),
        _row("after", "in-process", 29.0),
        _row("bare", "bare-in-process", 20.2),
    ]
    run.write_text("".join(json.dumps(r) + "\n" for r in rows))

    runs = load_runs([f"after={run}#after", f"floor={run}#bare", f"all={run}"])

    assert [r["cpu_us_per_token"] for r in runs["after"]] == [61.4, 29.0]
    assert [r["cpu_us_per_token"] for r in runs["floor"]] == [33.2, 20.2]
    assert len(runs["all"]) == 5
    # The floor's bars stand beside the edge's on the same upstream, not in a group of their own.
    assert [_key(r) for r in runs["floor"]] == [_key(r) for r in runs["after"]]
    assert _key(runs["after"][0]) != _key(runs["after"][1])

    out = tmp_path / "plot.png"
    plot(runs, out)
    assert out.read_bytes().startswith(b"\x89PNG")


def test_the_plot_goes_into_a_folder_it_makes(tmp_path: Path) -> None:
    """`-o` in a folder that does not exist yet is made, as every bench's output is, not a
    traceback after the plot was drawn."""
    run = tmp_path / "run.jsonl"
    run.write_text(json.dumps(_row("this", "in-process", 20.0)) + "\n")
    out = tmp_path / "new" / "streams.png"
    plot(load_runs([f"a={run}"]), out)
    assert out.read_bytes().startswith(b"\x89PNG")
