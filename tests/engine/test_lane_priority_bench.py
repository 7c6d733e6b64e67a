"""`python -m bench.lane_priority`, the command behind docs/bench-engine-knee.md's "The lane's pieces",
run small on the demo model: every option runs the scenario it claims (the paid prompt goes in while
the free one prefills, and its priority reaches the engine: its first token comes first), and the
figures it reports are consistent. A bench that no test runs rots between sessions; its timings
themselves are for docs/, not for a pass or a fail here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def test_the_lane_priority_bench_runs_every_option_with_the_paid_prompt_sent_mid_prefill(
    demo_dir: Path,
) -> None:
    # The demo model prefills 4,000 tokens in a few hundred ms: the paid prompt goes in 20 ms on.
    args = ["--model", str(demo_dir), "--quick", "--free-tokens", "4000", "--delay", "0.02"]
    done = subprocess.run(
        [sys.executable, "-m", "bench.lane_priority", *args, "--chunks", "64", "--json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows: dict[str, list[dict[str, Any]]] = {}
    for line in done.stdout.splitlines():
        if line.startswith("{"):
            row = json.loads(line)
            rows.setdefault(row.pop("kind"), []).append(row)
    [setup] = rows["setup"]
    assert setup["options"] == ["pieces of 512 (one forward a chunk)", "pieces of 128", "chunks of 64"]
    assert setup["streams"] == [0, 1]
    runs = rows["run"]
    assert sorted((r["streams"], r["option"]) for r in runs) == sorted(
        (s, o) for s in (0, 1) for o in setup["options"]
    )
    for run in runs:
        assert run["paid_sent_during_free_prefill"], run
        assert 0 < run["paid_sent_after_s"] < run["free_ttft_s"], run
        # Sent after the free prompt, first to a token: the bench gave the engine its priority.
        assert run["paid_first"], run
        assert 0 <= run["paid_ttft_s"] and run["prefill_cpu_s"] > 0, run
        if run["streams"]:
            assert run["gaps"] > 0, run
            quantiles = [run[k] for k in ("gap_p50_ms", "gap_p90_ms", "gap_p99_ms", "gap_max_ms")]
            assert 0 <= quantiles[0] <= quantiles[1] <= quantiles[2] <= quantiles[3], run
            assert run["steady_gap_p50_ms"] >= 0, run
        else:
            assert run["gaps"] == 0 and run["gap_p50_ms"] is None, run
    # One round: each summary's medians are its run's figures.
    by_key = {(r["streams"], r["option"]): r for r in runs}
    for summary in rows["summary"]:
        run = by_key[summary["streams"], summary["option"]]
        assert summary["rounds"] == 1 and summary["paid_sent_during_free_prefill"]
        for key in ("paid_ttft_s", "free_ttft_s", "prefill_cpu_s", "gap_p99_ms"):
            assert summary[key] == run[key], (key, summary, run)
        assert summary["paid_ttft_range_s"] == [run["paid_ttft_s"]] * 2
    [cost] = rows["piece_cost"]
    assert cost["context"] == 0
    assert sorted(cost) == ["context", "pieces_of_128_cpu_s", "pieces_of_512_cpu_s", "pieces_of_64_cpu_s"]
    assert all(v > 0 for k, v in cost.items() if k != "context")
