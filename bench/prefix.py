"""Multi-turn chat on 2 replicas: no prefix cache, cache with least-KV routing, cache with
prefix-aware routing, and worst-case against real-use KV admission, in one run.

Drives the admission Dispatcher and real in-process engines directly (as bench/fairness.py does):
what is measured is prefill saved by the KV cache, where the router sends each turn, and how many
streams admission lets a replica run, without HTTP, auth or the limiter in the way.

The workload, the same token for token in every configuration (greedy, seeded): `conversations`
chats, alternately paid and free, all sharing one system prompt; each turn resends the whole
history (system prompt, every earlier message and reply) plus a new user message, and its reply is
appended to the history. Clients declare a large max_tokens (`declared_max_tokens`), as chat
clients do, while the replies end much sooner (the reply length stands in for the model's end of
turn): that gap is what worst-case admission reserves for nothing.

Each conversation is its own user. The cache scope (`--cache-scope`, the edge's `[admission]
prefix_cache_scope`) defaults to "shared" here, as a single-tenant product whose users share the
system prompt runs it: every conversation after the first finds the system prompt cached. With
"user" (the edge's default) each user has a cache of its own, so each conversation's first turn
computes the system prompt afresh and only a conversation's own earlier turns are found.

    .venv/bin/python -m bench.prefix [--model demo] [--conversations 8] [--num-blocks 320] \
        [--variants 1 3 4 5] [--turns 4] [--cache-scope shared] [--out docs/bench-prefix.md]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import platform
import statistics
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import msgspec
import numpy as np

from edge.admission import Dispatcher, Ticket
from edge.admission.cache_scope import PrefixCacheScope, cache_salt
from edge.admission.prefix_index import routing_hashes
from edge.admission.real_use import RealUse
from edge.upstreams.base import GenerationRequest
from gpu_container.engine.async_engine import AsyncEngine
from gpu_container.engine.engine import LLMEngine
from gpu_container.engine.types import EngineConfig, EngineStats

PAID_PRIORITY, FREE_PRIORITY = 10, 0


@dataclass(frozen=True)
class Variant:
    name: str
    prefix_caching: bool
    prefix_weight: float
    real_use_margin: int | None = None  # None: worst-case admission
    # Offered load against the workload's: the last variant asks how many streams real-use
    # admission runs when offered more, at a paid TTFT p99 no worse than worst-case admission's.
    conversation_scale: float = 1.0

    def conversations(self, workload: Workload) -> int:
        return round(workload.conversations * self.conversation_scale)


VARIANTS = (
    Variant("before: no cache, least-KV, worst-case admission", False, 0.0),
    Variant("no cache, least-KV routing", False, 0.0, real_use_margin=32),
    Variant("cache, least-KV routing", True, 0.0, real_use_margin=32),
    Variant("cache, prefix-aware routing", True, 2.0, real_use_margin=32),
    Variant("cache, prefix-aware routing, worst-case admission", True, 2.0),
    Variant(
        "cache, prefix-aware routing, 1.5x the conversations",
        True,
        2.0,
        real_use_margin=32,
        conversation_scale=1.5,
    ),
)


@dataclass(frozen=True)
class Workload:
    conversations: int = 8
    turns: int = 4
    # As the workload: contexts of about 1K tokens by the later turns, replies of 200-400.
    system_tokens: int = 256
    user_tokens: tuple[int, int] = (64, 128)
    reply_tokens: tuple[int, int] = (200, 400)
    declared_max_tokens: int = 1024
    start_stagger_s: float = 0.2
    # A user reads the reply and types the next message: other conversations' load moves meanwhile.
    think_s: tuple[float, float] = (0.0, 3.0)
    seed: int = 7
    cache_scope: PrefixCacheScope = "shared"


@dataclass
class TurnResult:
    conversation: int
    turn: int
    paid: bool
    prompt_tokens: int
    ttft_s: float
    replica: str
    reply: list[int]
    queue_s: float = 0.0  # of ttft_s: waiting for the dispatcher's slot (the rest is the engine's)


@dataclass
class VariantResult:
    variant: Variant
    wall_s: float
    turns: list[TurnResult]
    engine_stats: list[EngineStats]
    running_samples: list[list[int]] = field(default_factory=list)  # per sample: running per replica
    kv_used_samples: list[float] = field(default_factory=list)

    def ttft(self, q: float, paid_only: bool = False) -> float:
        values = sorted(t.ttft_s for t in self.turns if t.paid or not paid_only)
        return float(np.quantile(values, q)) if values else float("nan")

    @property
    def hit_rate(self) -> float:
        hits = sum(s.prefix_hit_tokens for s in self.engine_stats)
        queries = sum(s.prefix_query_tokens for s in self.engine_stats)
        return hits / queries if queries else 0.0

    @property
    def preemptions(self) -> int:
        return sum(s.preemptions for s in self.engine_stats)

    @property
    def turns_at_home(self) -> float:
        """Share of later turns that went to the replica of the conversation's previous turn."""
        by_conv: dict[int, list[TurnResult]] = {}
        for t in sorted(self.turns, key=lambda t: (t.conversation, t.turn)):
            by_conv.setdefault(t.conversation, []).append(t)
        pairs = [(a, b) for ts in by_conv.values() for a, b in itertools.pairwise(ts)]
        return sum(a.replica == b.replica for a, b in pairs) / len(pairs) if pairs else 0.0

    @property
    def streams_per_replica(self) -> float:
        """Mean running sequences per replica over the samples where any ran."""
        busy = [sum(s) / len(s) for s in self.running_samples if any(s)]
        return statistics.fmean(busy) if busy else 0.0

    @property
    def kv_utilisation(self) -> float:
        return statistics.fmean(self.kv_used_samples) if self.kv_used_samples else 0.0


class Conversation:
    def __init__(self, index: int, system: list[int], workload: Workload, vocab: int) -> None:
        self.index = index
        self.paid = index % 2 == 0
        rng = np.random.default_rng(workload.seed * 1000 + index)
        self.user_messages = [
            rng.integers(100, vocab - 1, int(rng.integers(*workload.user_tokens, endpoint=True))).tolist()
            for _ in range(workload.turns)
        ]
        self.reply_lengths = [
            int(rng.integers(*workload.reply_tokens, endpoint=True)) for _ in range(workload.turns)
        ]
        self.think_s = [float(rng.uniform(*workload.think_s)) for _ in range(workload.turns)]
        self.system = system


async def _run_conversation(
    conv: Conversation, dispatcher: Dispatcher, workload: Workload, results: list[TurnResult]
) -> None:
    await asyncio.sleep(conv.index * workload.start_stagger_s)
    history = list(conv.system)
    for turn in range(workload.turns):
        if turn:
            await asyncio.sleep(conv.think_s[turn])
        prompt = history + conv.user_messages[turn]
        rid = f"c{conv.index}-t{turn}"
        user = f"user-{conv.index}"
        salt = cache_salt(user, workload.cache_scope)
        ticket = Ticket(
            request_id=rid,
            user=user,
            priority=PAID_PRIORITY if conv.paid else FREE_PRIORITY,
            kv_tokens=len(prompt) + workload.declared_max_tokens,
            max_wait_s=600.0,
            may_use_reserve=conv.paid,
            tier="paid" if conv.paid else "free",
            prefix_keys=routing_hashes(prompt, salt),
            prompt_tokens=len(prompt),
        )
        asked = time.perf_counter()
        slot = await dispatcher.acquire(ticket)
        queue_s = time.perf_counter() - asked
        request = GenerationRequest(
            rid, prompt, conv.reply_lengths[turn], temperature=0.0, priority=ticket.priority, cache_salt=salt
        )
        reply: list[int] = []
        ttft = float("nan")
        try:
            async for delta in slot.upstream.generate(request):
                if delta.token_ids and not reply:
                    ttft = time.perf_counter() - asked
                reply += delta.token_ids
                slot.grow(len(reply))
            slot.mark_finished()  # ran to its end: its length is what the user's replies run to
        finally:
            slot.release()
        results.append(
            TurnResult(conv.index, turn, conv.paid, len(prompt), ttft, slot.upstream.name, reply, queue_s)
        )
        history = prompt + reply


async def _sample(engines: list[LLMEngine], result: VariantResult, stop: asyncio.Event) -> None:
    while not stop.is_set():
        stats = [e.stats() for e in engines]
        result.running_samples.append([s.running for s in stats])
        used = sum(s.num_blocks - s.free_blocks for s in stats) / sum(s.num_blocks for s in stats)
        result.kv_used_samples.append(used)
        await asyncio.sleep(0.05)


async def run_variant(
    variant: Variant, model_dir: Path, engine: EngineConfig, workload: Workload, replicas: int = 2
) -> VariantResult:
    config = msgspec.structs.replace(engine, enable_prefix_caching=variant.prefix_caching)
    engines = [LLMEngine.from_pretrained(model_dir, config) for _ in range(replicas)]
    for e in engines:
        e.start()
    upstreams = [AsyncEngine(e, f"replica-{i}") for i, e in enumerate(engines)]
    dispatcher = Dispatcher(
        upstreams,
        reserved_paid_fraction=0.0,
        max_queue=1000,
        poll_interval_s=0.05,
        kv_block_tokens=config.block_size,
        prefix_weight=variant.prefix_weight,
        real_use=RealUse(variant.real_use_margin) if variant.real_use_margin else None,
    )
    await dispatcher.start()
    vocab = engines[0]._model.config.vocab_size  # the bench draws token ids inside its vocabulary
    system = np.random.default_rng(workload.seed).integers(100, vocab - 1, workload.system_tokens).tolist()
    conversations = [Conversation(i, system, workload, vocab) for i in range(variant.conversations(workload))]
    turns: list[TurnResult] = []
    result = VariantResult(variant, 0.0, turns, [])
    stop = asyncio.Event()
    sampler = asyncio.create_task(_sample(engines, result, stop))
    start = time.perf_counter()
    try:
        await asyncio.gather(*(_run_conversation(c, dispatcher, workload, turns) for c in conversations))
        result.wall_s = time.perf_counter() - start
        for e in engines:
            e.wait_until_idle(30)
        result.engine_stats = [e.stats() for e in engines]
    finally:
        stop.set()
        await sampler
        await dispatcher.aclose()
        for upstream in upstreams:
            await upstream.aclose()
    return result


def _table(results: list[VariantResult]) -> str:
    def vs_no_cache(r: VariantResult) -> str:
        """TTFT p50 against the uncached run with the same admission ("-" when none ran)."""
        same = [b for b in results if b.variant.real_use_margin == r.variant.real_use_margin]
        base = next((b for b in same if not b.variant.prefix_caching), None)
        return "-" if base is None else f"{r.ttft(0.5) / base.ttft(0.5):.2f}x"

    lines = [
        "| variant | TTFT p50 s | TTFT p99 s | paid TTFT p99 s | TTFT p50 vs before "
        "| vs no cache, same admission "
        "| prompt tokens from cache | later turns on the previous turn's replica "
        "| streams per replica | KV used | preemptions | wall s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r.variant.name} | {r.ttft(0.5):.2f} | {r.ttft(0.99):.2f} "
            f"| {r.ttft(0.99, paid_only=True):.2f} "
            f"| {r.ttft(0.5) / results[0].ttft(0.5):.2f}x | {vs_no_cache(r)} "
            f"| {r.hit_rate:.0%} | {r.turns_at_home:.0%} "
            f"| {r.streams_per_replica:.2f} | {r.kv_utilisation:.0%} | {r.preemptions} | {r.wall_s:.1f} |"
        )
    return "\n".join(lines)


def _goals(results: list[VariantResult]) -> str:
    """The issue's three goals, each from the variants of this run that it compares."""
    by_name = {r.variant.name: r for r in results}
    uncached = by_name.get("no cache, least-KV routing")
    cached = by_name.get("cache, prefix-aware routing")
    worst = by_name.get("cache, prefix-aware routing, worst-case admission")
    lines = ["| goal | this run | met? |", "|---|---|---|"]
    if cached and uncached:
        ratio = cached.ttft(0.5) / uncached.ttft(0.5)
        met = _yes(ratio <= 1 / 3)
        lines.append(
            f"| TTFT p50, cache and prefix-aware routing, at most 1/3 of no cache "
            f"| {cached.ttft(0.5):.2f} s against {uncached.ttft(0.5):.2f} s: {ratio:.2f}x | {met} |"
        )
    if cached:
        lines.append(
            f"| at least 70 % of prompt tokens from the cache | {cached.hit_rate:.0%} "
            f"| {_yes(cached.hit_rate >= 0.7)} |"
        )
    if worst:
        for r in results:
            if not r.variant.prefix_caching or r.variant.real_use_margin is None:
                continue
            ratio = r.streams_per_replica / worst.streams_per_replica
            paid, paid_worst = r.ttft(0.99, paid_only=True), worst.ttft(0.99, paid_only=True)
            met = _yes(ratio >= 1.5 and paid <= paid_worst)
            lines.append(
                f"| at least 1.5x the streams per replica from real-use admission ({r.variant.name}) "
                f"at a paid TTFT p99 no worse than worst-case admission's "
                f"| {r.streams_per_replica:.2f} against {worst.streams_per_replica:.2f}: {ratio:.2f}x, "
                f"paid TTFT p99 {paid:.1f} s against {paid_worst:.1f} s | {met} |"
            )
    return "\n".join(lines)


def _yes(met: bool) -> str:
    return "yes" if met else "**no**"


def _cacheable(turns: list[TurnResult], system_tokens: int, block: int) -> float:
    """The most of the prompt tokens a prefix cache could serve: each turn's whole blocks of what an
    earlier request computed (the system prompt, system_tokens: 0 where users do not share a cache;
    the previous turn's prompt and reply, less the reply's last token, whose K/V nobody computed),
    never its own last token. An upper bound: the first request to carry the system prompt finds
    nothing."""
    by_turn = {(t.conversation, t.turn): t for t in turns}
    cacheable = 0
    for t in turns:
        prev = by_turn.get((t.conversation, t.turn - 1))
        shared = system_tokens if prev is None else prev.prompt_tokens + len(prev.reply) - 1
        cacheable += min(shared, t.prompt_tokens - 1) // block * block
    return cacheable / max(sum(t.prompt_tokens for t in turns), 1)


def _profile(results: list[VariantResult], system_tokens: int, block: int) -> str:
    """Where TTFT goes: the dispatcher's queue or the engine, first turns or later ones, which
    replica took the turns, how many prompt tokens each turn still had to prefill, and how much
    of the prompts a cache could have served at most (eviction or routing losses show against it)."""
    lines = [
        "| variant | queue s (mean) | engine s (p50) | TTFT p50 turn 1 s | TTFT p50 later turns s "
        "| turns per replica | first turns per replica | prefilled tokens per turn "
        "| prompt tokens a cache could serve |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        replicas = sorted({t.replica for t in r.turns})
        spread = "/".join(str(sum(t.replica == name for t in r.turns)) for name in replicas)
        firsts = "/".join(str(sum(t.replica == name and t.turn == 0 for t in r.turns)) for name in replicas)
        queried = sum(s.prefix_query_tokens for s in r.engine_stats)
        prefilled = (queried - sum(s.prefix_hit_tokens for s in r.engine_stats)) / max(len(r.turns), 1)
        first = [t.ttft_s for t in r.turns if t.turn == 0]
        later = [t.ttft_s for t in r.turns if t.turn > 0]
        lines.append(
            f"| {r.variant.name} | {statistics.fmean(t.queue_s for t in r.turns):.2f} "
            f"| {statistics.median(t.ttft_s - t.queue_s for t in r.turns):.2f} "
            f"| {statistics.median(first):.2f} | {statistics.median(later) if later else float('nan'):.2f} "
            f"| {spread} | {firsts} | {prefilled:.0f} | {_cacheable(r.turns, system_tokens, block):.0%} |"
        )
    return "\n".join(lines)


def _plot(results: list[VariantResult], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r.variant.name.replace(": ", ":\n").replace(", w", ",\nw") for r in results]
    fig, axes = plt.subplots(1, 3, figsize=(16, 5.5))
    x = np.arange(len(results))
    axes[0].bar(x - 0.2, [r.ttft(0.5) for r in results], 0.4, label="p50")
    axes[0].bar(x + 0.2, [r.ttft(0.99) for r in results], 0.4, label="p99")
    uncached = [r for r in results if not r.variant.prefix_caching and r.variant.real_use_margin]
    if uncached:
        goal = uncached[0].ttft(0.5) / 3
        axes[0].axhline(goal, color="tab:red", ls="--", label=f"goal: p50 <= 1/3 of no cache ({goal:.1f} s)")
    axes[0].set_title("TTFT (s), queueing included")
    axes[0].legend(fontsize=8)
    axes[1].bar(x, [100 * r.hit_rate for r in results], color="tab:green")
    axes[1].axhline(70, color="tab:red", ls="--", label="goal: at least 70 %")
    axes[1].set_title("prompt tokens served from the prefix cache (%)")
    axes[1].set_ylim(0, 100)
    axes[1].legend(fontsize=8)
    axes[2].bar(x, [r.streams_per_replica for r in results], color="tab:purple")
    worst = [r for r in results if r.variant.prefix_caching and not r.variant.real_use_margin]
    if worst:
        goal = 1.5 * worst[0].streams_per_replica
        axes[2].axhline(goal, color="tab:red", ls="--", label=f"goal: 1.5x worst-case admission ({goal:.2f})")
        axes[2].legend(fontsize=8)
    axes[2].set_title("streams running per replica (mean while busy)")
    for ax in axes:
        ax.set_xticks(x, names, fontsize=7, rotation=25, ha="right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _model_dir(choice: str) -> tuple[Path, str]:
    if choice == "demo":
        from gpu_container.engine.demo_model import build_demo_model

        return build_demo_model(Path(".floodgate/demo-model")), "the demo model (random weights, 2 layers)"
    if choice != "default":
        return Path(choice), choice
    from edge.config import load_settings
    from edge.model_source import resolve_model_dir

    model = load_settings().model
    return resolve_model_dir(model), f"{model.name} (the real model, imported by `floodgate model import`)"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--model", default="default", help="'default' (the [model] settings), 'demo', or a path"
    )
    parser.add_argument("--conversations", type=int, default=Workload.conversations)
    parser.add_argument("--turns", type=int, default=Workload.turns)
    parser.add_argument("--system-tokens", type=int, default=Workload.system_tokens)
    parser.add_argument(
        "--user-tokens", type=int, nargs=2, default=Workload.user_tokens, metavar=("MIN", "MAX")
    )
    parser.add_argument(
        "--reply-tokens", type=int, nargs=2, default=Workload.reply_tokens, metavar=("MIN", "MAX")
    )
    parser.add_argument(
        "--cache-scope",
        choices=["shared", "user"],
        default=Workload.cache_scope,
        help="whose cached prefixes a turn may hit: every user's, or its own user's",
    )
    parser.add_argument("--num-blocks", type=int, default=320, help="KV blocks of 16 tokens per replica")
    parser.add_argument(
        "--variants", type=int, nargs="*", default=None, help="run only these (0-based, in table order)"
    )
    parser.add_argument("--out", type=Path, default=None, help="write the report (and a PNG beside it)")
    args = parser.parse_args(argv)
    if args.variants is not None and not all(0 <= i < len(VARIANTS) for i in args.variants):
        parser.error(f"--variants: numbers 0 to {len(VARIANTS) - 1}, in table order")
    model_dir, model_name = _model_dir(args.model)
    workload = Workload(
        conversations=args.conversations,
        turns=args.turns,
        system_tokens=args.system_tokens,
        user_tokens=(args.user_tokens[0], args.user_tokens[1]),
        reply_tokens=(args.reply_tokens[0], args.reply_tokens[1]),
        cache_scope=args.cache_scope,
    )
    variants = VARIANTS if args.variants is None else [VARIANTS[i] for i in args.variants]
    engine = EngineConfig(
        block_size=16,
        num_blocks=args.num_blocks,
        max_num_seqs=8,
        max_num_batched_tokens=512,
        max_model_len=2048,
    )
    load_before = os.getloadavg()[0]
    started = datetime.now(UTC)
    results = []
    for variant in variants:
        result = asyncio.run(run_variant(variant, model_dir, engine, workload))
        print(f"{variant.name}: TTFT p50 {result.ttft(0.5):.2f}s, cache {result.hit_rate:.0%}", flush=True)
        results.append(result)
    replies = [{(t.conversation, t.turn): t.reply for t in r.turns} for r in results]
    # A scaled variant has conversations the others lack: compare the ones every variant ran.
    common = set.intersection(*(set(r) for r in replies))
    same_replies = all({k: r[k] for k in common} == {k: replies[0][k] for k in common} for r in replies)
    table = _table(results) + "\n\n" + _goals(results)
    shareable = workload.system_tokens if workload.cache_scope == "shared" else 0
    profile = _profile(results, shareable, engine.block_size)
    print(table)
    print(profile)
    print(f"replies identical in every variant: {same_replies}")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        png = args.out.with_suffix(".png")
        _plot(results, png)
        header = (
            f"Run {started:%Y-%m-%d %H:%M} UTC on {platform.machine()} with {os.cpu_count()} cores "
            f"(load average {load_before:.1f} before the run), model: {model_name}. Workload: "
            f"{workload.conversations} conversations x {workload.turns} turns, system prompt "
            f"{workload.system_tokens} tokens, user messages "
            f"{workload.user_tokens[0]}-{workload.user_tokens[1]}, "
            f"replies {workload.reply_tokens[0]}-{workload.reply_tokens[1]} tokens, think time "
            f"{workload.think_s[0]:g}-{workload.think_s[1]:g} s, declared max_tokens "
            f"{workload.declared_max_tokens}; prefix cache scope {workload.cache_scope!r}; "
            f"2 replicas of {engine.num_blocks} KV blocks x "
            f"{engine.block_size} "
            f"tokens. Replies identical in every variant: {same_replies}."
        )
        figure = f"![bench-prefix]({png.name})"
        args.out.write_text(
            f"<!-- generated by python -m bench.prefix -->\n{header}\n\n{table}\n\n{profile}\n\n{figure}\n"
        )


if __name__ == "__main__":
    main()
