"""Issue 11's goals across every kept run: which views the edge misses on its own, and which no
server could meet on the instance that ran them (the bare server's own figure past the bound).

python -m bench.edge_goals_across [DIR ...] [--out docs/bench-edge-goals/across.md]

Each DIR is a kept run of `python -m bench.edge_goals` (default: every folder under
docs/bench-edge-goals/ with a run.json), judged again as bench/edge_goals_verdict.py judges it.
Per view: in how many runs it was measured and met; in how many of those it missed, how often the
floor (bench/bare_sse_server.py: the same protocol and loop, nothing of the edge's) was past the
bound too, where only a cheaper server stack or a faster instance would meet it; and the edge's
figure over its floor (median over the runs: what the edge's own work adds, the part a change to
the edge can move). Views without a floor say so. `--out` writes the table there and the plot
beside it (same name, .png): one point per run and view, the floor's share of the bound across,
the edge's up, so a view's misses are seen to lie past the floor's bound or not.
"""

from __future__ import annotations

import argparse
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from bench.edge_goals_verdict import Figure, figures_of, read_run

KEPT = Path(__file__).resolve().parents[1] / "docs" / "bench-edge-goals"


@dataclass
class View:
    """One goal's view over the runs."""

    goal: str
    view: str
    runs: list[tuple[str, Figure]] = field(default_factory=list)

    @property
    def met(self) -> int:
        return sum(f.met for _, f in self.runs)

    @property
    def floored(self) -> list[tuple[str, Figure]]:
        return [(run, f) for run, f in self.runs if f.floor is not None and not math.isnan(f.floor)]

    @property
    def missed_past_floor(self) -> int:
        """Misses where the floor itself was past the bound: no server meets it on that instance."""
        return sum(not f.met and f.to_goal(f.floor) > 1 for _, f in self.floored if f.floor is not None)

    @property
    def over_floor(self) -> float | None:
        """Median of the edge's figure over its floor (on the goal's side: above 1 is the edge's own)."""
        shares = [f.to_goal(f.value) / f.to_goal(f.floor) for _, f in self.floored if f.floor]
        return statistics.median(shares) if shares else None


def _started(run: Path) -> str:
    steps = read_run(run).steps.values()
    return min((str(step.get("started_utc", "")) for step in steps), default="")


def runs_in(folder: Path) -> list[Path]:
    """The kept runs under `folder`, oldest first (by their first command's start)."""
    return sorted((p.parent for p in folder.glob("*/run.json")), key=_started)


def views_of(dirs: list[Path]) -> list[View]:
    """Every view measured in some run, in the order of the last run's table (views it no longer
    has after them)."""
    views: dict[tuple[str, str], View] = {}
    for d in reversed(dirs):
        for f in figures_of(read_run(d)):
            if not math.isnan(f.value):
                views.setdefault((f.goal, f.view), View(f.goal, f.view)).runs.insert(0, (d.name, f))
    return list(views.values())


def table(views: list[View], dirs: list[Path]) -> str:
    lines = [
        f"Issue 11's goals over {len(dirs)} kept runs of `python -m bench.edge_goals` "
        f"({', '.join(d.name for d in dirs)}).",
        "",
        "| goal | view | runs | met | missed with the floor past the bound | edge / floor (median) |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for v in views:
        missed = len(v.runs) - v.met
        past = f"{v.missed_past_floor} of {missed}" if missed and v.floored else ("" if missed else "-")
        over = "" if v.over_floor is None else f"{v.over_floor:.2f}x"
        lines.append(f"| {v.goal} | {v.view} | {len(v.runs)} | {v.met} | {past} | {over} |")
    return "\n".join(lines) + "\n"


def plot(views: list[View], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    goals = list(dict.fromkeys(v.goal for v in views if v.floored))
    palette = plt.get_cmap("tab10")
    colours = {goal: palette(i) for i, goal in enumerate(goals)}
    fig, ax = plt.subplots(figsize=(8, 6.5))
    for v in views:
        for _, f in v.floored:
            assert f.floor is not None
            x, y = f.to_goal(f.floor), f.to_goal(f.value)
            ax.scatter(
                min(x, 3), min(y, 3), s=14, color=colours[v.goal], marker="o" if f.met else "x", alpha=0.7
            )
    for goal, colour in colours.items():
        ax.scatter([], [], color=colour, label=goal, s=14)
    ax.axvline(1, color="black", lw=1, ls="--")
    ax.axhline(1, color="black", lw=1, ls="--")
    ax.plot([0, 3], [0, 3], color="grey", lw=0.8)
    ax.set_xlim(0, 3)
    ax.set_ylim(0, 3)
    ax.set_xlabel("the bare server's figure / the goal's bound (right of 1: no server meets it there)")
    ax.set_ylabel("the edge's figure / the goal's bound (under 1: met)")
    ax.set_title(
        "Issue 11's goals over the kept runs: each point one view in one run (x: missed)", fontsize=9
    )
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.edge_goals_across", description=__doc__)
    parser.add_argument("dirs", nargs="*", type=Path, help="kept runs (default: every one under docs/)")
    parser.add_argument("--out", type=Path, help="write the table here and the plot beside it (.png)")
    args = parser.parse_args(argv)
    if not_runs := [str(d) for d in args.dirs if not (d / "run.json").is_file()]:
        parser.error(f"not kept runs (no run.json): {', '.join(not_runs)}")
    dirs = args.dirs or runs_in(KEPT)
    views = views_of(dirs)
    text = table(views, dirs)
    print(text, end="")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
        plot(views, args.out.with_suffix(".png"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
