"""docs/bench-fleet.md and its plots from the outcomes of `python -m bench.fleet`."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from bench.fleet import gpu_figures as fig
from bench.fleet import step_curve
from bench.fleet.recorder import Recorder
from bench.fleet.simulation import Outcome
from bench.fleet.terraform import ScalingSettings

TIERS = ("paid", "free")
CAPACITY_REASONS = ("wait", "no_replica")


def _hours(t: np.ndarray) -> np.ndarray:  # type: ignore[type-arg]
    return t / 3600.0


def ttft_series(r: Recorder, tier: str, q: float, bin_s: float = 600.0) -> tuple[list[float], list[float]]:
    at = np.array(r.ttft_at.get(tier, []))
    vals = np.array(r.ttft.get(tier, []))
    if at.size == 0:
        return [], []
    bins = np.floor(at / bin_s)
    xs, ys = [], []
    for b in np.unique(bins):
        sel = vals[bins == b]
        xs.append((b + 0.5) * bin_s / 3600.0)
        ys.append(float(np.percentile(sel, q)))
    return xs, ys


def rejected_series(r: Recorder, tier: str, reasons: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:  # type: ignore[type-arg]
    rows = [r.minutes[k] for k in sorted(r.minutes)]
    t = np.array([m.t for m in rows])
    per_s = np.array([sum(m.rejected.get((tier, x), 0) for x in reasons) / 60.0 for m in rows])
    return t, per_s


def plot_day(outcomes: Sequence[Outcome], path: Path, groups: int) -> None:
    fig_, axes = plt.subplots(5, 1, figsize=(11, 15), sharex=True)
    for o in outcomes:
        r = o.recorder
        t, offered = r.series("offered")
        axes[0].plot(_hours(t), offered / 60.0 * groups, label=o.scenario.name)
        t, gpus = r.series("gpus_in_service")
        axes[1].plot(_hours(t), gpus * groups, label=o.scenario.name)
        t, util = r.utilisation()
        axes[2].plot(_hours(t), util, label=o.scenario.name)
        for tier, style in (("paid", "-"), ("free", ":")):
            xs, ys = ttft_series(r, tier, 99)
            axes[3].plot(xs, ys, style, label=f"{o.scenario.name}, {tier} p99")
            t, rej = rejected_series(r, tier, CAPACITY_REASONS)
            axes[4].plot(_hours(t), rej * groups, style, label=f"{o.scenario.name}, {tier}")
    axes[0].set_ylabel("prompts/s (fleet)")
    axes[1].set_ylabel("GPUs in service (fleet)")
    axes[2].set_ylabel("utilisation\n(output / full-batch output)")
    axes[3].set_ylabel("TTFT p99 (s), 10-min bins")
    axes[3].set_yscale("log")
    axes[4].set_ylabel("429/s for capacity (fleet)")
    axes[4].set_yscale("symlog", linthresh=10)
    axes[4].set_ylim(bottom=0)
    axes[4].set_xlabel("hour of the day (UTC)")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")
    fig_.suptitle("One simulated day at the design's scale (the fleet = one simulated group x groups)")
    fig_.tight_layout()
    fig_.savefig(path, dpi=90)
    plt.close(fig_)


def summary_row(o: Outcome) -> dict[str, float]:
    r = o.recorder
    offered = {t: max(1, r.offered_by_tier[t]) for t in TIERS}
    gpu_hours = r.gpu_seconds / 3600.0
    return {
        "gpu_hours": gpu_hours,
        "mean_gpus": r.gpu_seconds / max(1.0, o.scenario.traffic.duration_s),
        "cost": o.dollars_per_million_tokens,
        "util": float(np.mean(r.utilisation()[1])),
        **{f"{t}_p50": r.ttft_percentile(t, 50) for t in TIERS},
        **{f"{t}_p99": r.ttft_percentile(t, 99) for t in TIERS},
        **{f"{t}_cap429": 100.0 * r.rejected_total(t, CAPACITY_REASONS) / offered[t] for t in TIERS},
        **{f"{t}_limit429": 100.0 * r.rejected_total(t, ("limit",)) / offered[t] for t in TIERS},
        "actions": float(len(o.actions)),
    }


def plot_compare(outcomes: Sequence[Outcome], path: Path) -> None:
    rows = [summary_row(o) for o in outcomes]
    names = [o.scenario.name for o in outcomes]
    panels = (
        ("cost", "$ per million output tokens"),
        ("free_cap429", "free 429s for capacity (%)"),
        ("paid_p99", "paid TTFT p99 (s)"),
        ("free_p99", "free TTFT p99 (s)"),
    )
    fig_, axes = plt.subplots(1, len(panels), figsize=(16, 5), sharey=True)
    y = np.arange(len(names))
    for ax, (key, label) in zip(axes, panels, strict=True):
        ax.barh(y, [row[key] for row in rows], color="tab:blue")
        ax.set_xlabel(label)
        ax.grid(axis="x", alpha=0.3)
        if key.endswith("p99"):
            ax.set_xscale("log")
    axes[0].set_yticks(y, names)
    axes[0].invert_yaxis()
    fig_.tight_layout()
    fig_.savefig(path, dpi=90)
    plt.close(fig_)


def _f(x: float, digits: int = 2) -> str:
    return "–" if math.isnan(x) else f"{x:,.{digits}f}"


def scenario_table(outcomes: Sequence[Outcome], groups: int) -> str:
    lines = [
        "| scenario | fleet GPUs (mean) | utilisation | $/M tokens | paid TTFT p50 / p99 s "
        "| free TTFT p50 / p99 s | paid 429 capacity / limit % | free 429 capacity / limit % "
        "| scaling actions |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for o in outcomes:
        s = summary_row(o)
        lines.append(
            f"| {o.scenario.name} | {s['mean_gpus'] * groups:,.0f} | {s['util']:.2f} | {_f(s['cost'])} "
            f"| {_f(s['paid_p50'])} / {_f(s['paid_p99'])} | {_f(s['free_p50'])} / {_f(s['free_p99'])} "
            f"| {_f(s['paid_cap429'])} / {_f(s['paid_limit429'])} "
            f"| {_f(s['free_cap429'])} / {_f(s['free_limit429'])} "
            f"| {s['actions']:.0f} |"
        )
    return "\n".join(lines)


def settings_table(s: ScalingSettings) -> str:
    return "\n".join(
        [
            "| setting | value | read from |",
            "|---|---:|---|",
            f"| min_size / max_size | {s.min_size} / {s.max_size} "
            f"| iac/envs/example/variables.tf `models` ({s.model}) |",
            f"| warm_pool_min_size | {s.warm_pool_min_size} | same |",
            f"| demand_target | {s.demand_target} | same |",
            f"| warm pool's MaxGroupPreparedCapacity | {s.prepared_capacity} "
            "| iac/modules/gpu_pool (warm_pool_max_prepared, unset: warm_pool_min_size) |",
            f"| surge_demand | {s.surge_demand} | iac/modules/gpu_pool/variables.tf |",
            f"| surge steps (from threshold, +%) | {', '.join(f'{lo:g}→{p}%' for lo, _, p in s.surge_steps)} "
            "| iac/modules/gpu_pool/scaling.tf |",
            f"| surge alarm datapoints | {s.surge_datapoints} | same |",
            f"| estimated_instance_warmup | {s.instance_warmup_s} s | same |",
            f"| scale_in_drain_s | {s.scale_in_drain_s} s | iac/modules/gpu_pool/variables.tf |",
            f"| metric period / samples | {s.metric_period_s} s / {s.samples_per_period} "
            "| iac/modules/scaling_metric/outputs.tf |",
        ]
    )


def curve_table() -> str:
    c = step_curve.h200_llama70b()
    lines = [
        "| ISL/OSL | NVIDIA tokens/s/GPU | the curve's | used to fit |",
        "|---|---:|---:|---|",
    ]
    for row in fig.LLAMA_70B_H200_TP1:
        fit = (row.isl, row.osl) in ((1000, 1000), (2048, 128))
        pred = step_curve.predicted_throughput(c, row.isl, row.osl)
        used = "yes" if fit else "no"
        lines.append(f"| {row.isl}/{row.osl} | {row.output_tokens_per_s:,.0f} | {pred:,.0f} | {used} |")
    return "\n".join(lines)


def write(
    outcomes: Sequence[Outcome],
    day_outcomes: Sequence[Outcome],
    docs: Path,
    command: str,
    machine: str,
    wall_s: float,
    cpu_note: str,
) -> None:
    groups = outcomes[0].scenario.traffic.groups
    bundle = outcomes[0].scenario.traffic.bundle
    docs.mkdir(parents=True, exist_ok=True)
    plot_day(day_outcomes, docs / "fleet-day.png", groups)
    plot_compare(outcomes, docs / "fleet-compare.png")
    c = step_curve.h200_llama70b()
    full = c.tokens_per_s(c.max_sequences)
    request_ms = c.request_gpu_s(1000, 500, c.max_sequences) * 1e3
    ideal = fig.DOLLARS_PER_GPU_HOUR / 3600 * request_ms / 1e3 / 500 * 1e6  # $/M at 1000/500, busy GPU
    text = f"""# Fleet simulation (`{command}`)

Generated by `bench/fleet/report.py`; the reading of it is in [scale.md](scale.md).
Machine: {machine}; the whole run took {wall_s:.0f} s.

One GPU group serves 1/{groups} of the design's traffic (peak 30K prompts/s over the fleet, so
{30000 / groups:,.0f}/s here); each simulated request stands for {bundle} identical ones. Fleet
figures (GPUs, 429/s) are the group's times {groups}. A host is a p5en.48xlarge (8 x H200, each GPU
a TP1 Llama 3.3 70B FP8 engine with {c.max_sequences} sequences of KV at ~1.5K tokens).

## The replica's step curve

step(B, P) = {c.fixed_s * 1e3:.1f} ms + {c.per_sequence_s * 1e3:.3f} ms x B
+ {c.per_prefill_token_s * 1e3:.3f} ms x P
(B sequences decoding, P prompt tokens prefilled in the step). Fitted to two rows of NVIDIA's
TensorRT-LLM performance overview ({fig.PERF_OVERVIEW_URL}), the other rows check it:

{curve_table()}

One GPU: {c.tokens_per_s(1):.0f} tokens/s at batch 1, {full:,.0f} at the full batch of {c.max_sequences}
(decode only); the design's 1000/500 request costs {request_ms:.0f} ms of GPU.
At ${fig.DOLLARS_PER_GPU_HOUR}/GPU-hour ({fig.PRICE_URL}, p5en.48xlarge Capacity Block, effective
accelerator rate) a GPU busy every second costs ${ideal:.2f} per million output tokens: the floor
every row below is measured against.

{cpu_note}

## The Terraform's numbers (read by `bench/fleet/terraform.py`)

{settings_table(outcomes[0].scenario.scaling)}

## Scenarios (same day, same seed)

Every row scales on the deployed signal (edge/scaling/: the GPU time the requests past the limiter
ask for per second, priced at a full batch, over the GPUs in service, MAX'ed with the replicas' own
load) except the four "sequences" rows, which scale on the signal it replaced ((in flight + queued
+ turned away) / sequences of the replicas in service).

{scenario_table(outcomes, groups)}

"429 capacity" is the edge turning a request away (wait too long, no replica); "limit" is the
user's own request/token limit. TTFT includes the queue wait. Utilisation is the output rate of
the hosts in service over their output with every slot busy (static batching: the share of GPUs
running a batch, padding included).

![the day](fleet-day.png)

![scenarios](fleet-compare.png)
"""
    (docs / "bench-fleet.md").write_text(text)
