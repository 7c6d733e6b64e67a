"""The edge's own CPU per streamed chunk, side by side with a bare Litestar relay (the floor).

python -m bench.relay [--concurrency 1,64,256] [--duration 8] [--chunks 256] [--json]

Each variant is a separate server process (the edge's variants with `floodgate serve`'s uvicorn
settings and HTTP protocol, edge/server.py; the bare one with stock uvicorn + uvloop + httptools);
its CPU is read from /proc/<pid>/stat around a load of aiohttp streams:

- bare: a Litestar app streaming pre-encoded SSE chunks as fast as the client takes them;
- edge: the real app (auth, limiter, admission, detokenizer, stop strings, metrics) in front of a
  zero-cost upstream that yields a fixed cycle of the demo tokenizer's ids, so no model runs;
- triton (opt-in, `--variants bare,edge,triton`): the real app in front of a local tritonserver
  running the demo model (its own process, not counted): the edge plus its Triton client (HTTP
  `generate_stream`, edge/upstreams/triton_sse.py);
- triton-grpc (opt-in): the same through the edge's earlier client, one grpc.aio stream per
  request (bench/triton_grpc.py);
- triton-shared (opt-in): the same through another measured alternative, one synchronous gRPC
  stream per replica read on a thread (bench/triton_shared_stream.py);
- triton-zero (opt-in): the edge and its Triton client in front of a replica that speaks Triton's
  HTTP `generate_stream` with no model (bench/zero_cost_replica.py, its own process, not counted),
  as fast as the edge reads: the Triton path at the zero-cost upstream's pace.

The same process serves one variant: `python -m bench.relay --serve bare|edge --config FILE`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

from litestar import Litestar, get, post
from litestar.response import Stream

from bench.__main__ import machine
from bench.edge_server import BENCH_TIER, EdgeProcess, wait_ready
from bench.free_ports import free_port
from bench.loadgen import markdown_table, run_load
from bench.names import names_of
from bench.paced_upstream import TOKEN_CYCLE
from bench.trees import parse_trees
from bench.zero_cost_replica import running_replica
from edge.config import Settings
from edge.upstreams.base import Capacity, Delta, GenerationRequest, Upstream

BARE_CHUNK = b'data: {"id":"chatcmpl-0","object":"chat.completion.chunk","created":0,"model":"m","choices":[{"index":0,"delta":{"content":" fox"},"finish_reason":null}]}\n\n'  # noqa: E501


def _bare_app(chunks: int) -> Litestar:
    usage = (
        b'data: {"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":%d,"total_tokens":%d}}\n\n'
        % (chunks, chunks + 1)
    )

    async def body() -> AsyncIterator[bytes]:
        for _ in range(chunks):
            yield BARE_CHUNK
        yield usage
        yield b"data: [DONE]\n\n"

    @post("/v1/chat/completions", status_code=200)
    async def relay() -> Stream:
        return Stream(body(), media_type="text/event-stream")

    @get("/readyz")
    async def readyz() -> str:
        return "ok"

    return Litestar(route_handlers=[relay, readyz], openapi_config=None)


class ZeroCostUpstream:
    """A replica with no compute: the ids of TOKEN_CYCLE, one per delta, as fast as they are read."""

    name = "zero-cost"

    async def generate(self, req: GenerationRequest) -> AsyncIterator[Delta]:
        ids = itertools.cycle(TOKEN_CYCLE)
        for _ in range(req.max_new_tokens - 1):
            yield Delta([next(ids)])
        yield Delta([next(ids)], "length")

    async def capacity(self) -> Capacity:
        return Capacity(kv_tokens_total=1 << 30, kv_tokens_used=0, max_sequences=4096, running=0, waiting=0)

    async def ready(self) -> bool:
        return True

    async def aclose(self) -> None:
        return None


@asynccontextmanager
async def zero_cost_upstreams(settings: Settings, model_dir: Path) -> AsyncIterator[list[Upstream]]:
    yield [ZeroCostUpstream()]


def _serve(variant: str, config: Path, port: int, chunks: int, replica_port: int | None) -> None:
    import uvicorn

    if variant == "bare":
        uvicorn.run(
            _bare_app(chunks),
            host="127.0.0.1",
            port=port,
            loop="uvloop",
            http="httptools",
            log_level="warning",
            log_config=None,
        )
        return
    from edge.app import create_app
    from edge.config import load_settings
    from edge.gc_tuning import quiet_gc
    from edge.logging_setup import configure_logging
    from edge.server import uvicorn_config

    configure_logging()
    if variant == "edge":
        settings = load_settings(str(config))
        app = create_app(settings, zero_cost_upstreams)
    elif variant == "triton-zero":
        spec = f"127.0.0.1:{replica_port}:{replica_port}"
        settings = load_settings(str(config), {"upstream": {"triton": spec}})
        app = create_app(settings)
    else:
        settings = load_settings(str(config), {"upstream": {"triton": "local"}})
        if variant == "triton":
            app = create_app(settings)
        else:
            from bench.triton_grpc import local_grpc_upstreams

            app = create_app(settings, local_grpc_upstreams(variant.removeprefix("triton-")))
    quiet_gc()  # as `floodgate serve` does
    # The edge's own server settings and HTTP protocol (edge/http_protocol.py), as `floodgate serve`.
    config_ = uvicorn_config(app, settings.server, host="127.0.0.1", port=port, log_config=None)
    uvicorn.Server(config_).run()


@contextmanager
def _server(variant: str, chunks: int, tree: Path | None = None) -> Iterator[EdgeProcess]:
    """`tree`: serve from another checkout (its edge/ and bench/), to compare versions in one run."""
    from edge.config import load_settings
    from edge.keys.provision import create_keys

    with tempfile.TemporaryDirectory(prefix="floodgate-relay-") as tmp:
        port = free_port()
        config = Path(tmp) / "bench.toml"
        config.write_text(
            f'[server]\nport = {port}\n[keys]\nsqlite_path = "{tmp}/keys.db"\n'
            '[model]\nsource = "demo"\nname = "floodgate-tiny"\n'
            f'demo_dir = "{Path(".floodgate/demo-model").resolve()}"\n' + BENCH_TIER
        )
        key = create_keys(load_settings(config), {"bench": ("bench", "bench")})["bench"]
        cmd = [sys.executable, "-m", "bench.relay", "--serve", variant, "--config", str(config)]
        cmd += ["--port", str(port), "--chunks", str(chunks)]
        replica = contextlib.ExitStack()
        if variant == "triton-zero":
            replica_port = free_port()
            replica.enter_context(running_replica(replica_port, cwd=tree))
            cmd += ["--replica-port", str(replica_port)]
        profile = os.environ.get("RELAY_PROFILE")
        if profile:
            # RELAY_PROFILE=/tmp/prof: py-spy's collapsed stacks of each server in /tmp/prof-<variant>.txt
            py_spy = str(Path(sys.executable).parent / "py-spy")
            out = f"{profile}-{variant}.txt"
            # RELAY_PROFILE_FLAGS: py-spy's other flags (default --nonblocking; --native for the C below).
            flags = os.environ.get("RELAY_PROFILE_FLAGS", "--nonblocking").split()
            cmd = [py_spy, "record", "-r", "500", *flags, "-o", out, "-f", "raw", "--", *cmd]
        log = open(Path(tmp) / "server.log", "w")
        env = {**os.environ, "PYTHONPATH": str(tree)} if tree else None
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log, cwd=tree, env=env)
        base_url = f"http://127.0.0.1:{port}"
        try:
            wait_ready(proc, base_url, Path(tmp) / "server.log", 120, variant)
            yield EdgeProcess(base_url, key, _server_pid(proc.pid))
        finally:
            # py-spy writes its profile on SIGINT (and stops the server it runs).
            proc.send_signal(signal.SIGINT if profile else signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
            log.close()
            replica.close()


def _server_pid(pid: int) -> int:
    """The Python server itself, also when py-spy wraps it (then it is py-spy's child)."""
    children = Path(f"/proc/{pid}/task/{pid}/children")
    kids = children.read_text().split() if children.exists() else []
    return int(kids[0]) if kids else pid


def measure(
    variants: list[str],
    concurrency: list[int],
    duration_s: float,
    chunks: int,
    trees: list[tuple[str, Path | None]] | None = None,
) -> list[dict[str, Any]]:
    """One row per variant (and tree) and concurrency: chunks/s, server CPU µs per chunk, errors,
    × bare. The bare relay runs once, from this checkout."""
    rows: list[dict[str, Any]] = []
    runs = [
        (variant, label, tree)
        for variant in variants
        for label, tree in ([("this", None)] if variant == "bare" else trees or [("this", None)])
    ]
    for variant, label, tree in runs:
        with _server(variant, chunks, tree) as server:
            for n in concurrency:
                before = server.cpu_seconds()
                load = asyncio.run(
                    run_load(
                        server.base_url, server.key, concurrency=n, duration_s=duration_s, max_tokens=chunks
                    )
                )
                cpu = server.cpu_seconds() - before
                rows.append(
                    {
                        "variant": variant,
                        "tree": label,
                        "streams": n,
                        "chunks": load.tokens,
                        "chunks_per_s": load.tokens / load.wall_s,
                        "server_cpu_us_per_chunk": cpu / max(load.tokens, 1) * 1e6,
                        "errors": load.errors,
                    }
                )
    floors = {r["streams"]: r["server_cpu_us_per_chunk"] for r in rows if r["variant"] == "bare"}
    for row in rows:
        if floors.get(row["streams"]):
            row["x_bare"] = row["server_cpu_us_per_chunk"] / floors[row["streams"]]
    return rows


def table_rows(rows: list[dict[str, Any]]) -> list[dict[str, str]]:
    return [
        {
            "variant": row["variant"] if row["tree"] == "this" else f"{row['variant']} ({row['tree']})",
            "streams": str(row["streams"]),
            "chunks": str(row["chunks"]),
            "chunks/s": f"{row['chunks_per_s']:.0f}",
            "server CPU µs/chunk": f"{row['server_cpu_us_per_chunk']:.1f}",
            "errors": str(row["errors"]),
            "× bare": f"{row['x_bare']:.2f}" if "x_bare" in row else "",
        }
        for row in rows
    ]


# Every server a row can measure (the module doc): --variants picks some, --serve runs one.
VARIANTS = ("bare", "edge", "triton", "triton-grpc", "triton-shared", "triton-zero")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.relay")
    parser.add_argument("--concurrency", default="1,64,256")
    parser.add_argument("--duration", type=float, default=8.0)
    parser.add_argument("--chunks", type=int, default=256, help="text chunks per stream")
    parser.add_argument("--variants", default="bare,edge", type=names_of(VARIANTS))
    parser.add_argument("--json", action="store_true", help="one JSON object per variant and concurrency")
    parser.add_argument(
        "--trees",
        default="",
        help="LABEL=DIR,...: run the edge variants from these checkouts too, in the same run",
    )
    parser.add_argument(
        "--serve",
        choices=VARIANTS,
        help=argparse.SUPPRESS,
    )
    parser.add_argument("--replica-port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--config", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        _serve(args.serve, args.config, args.port, args.chunks, args.replica_port)
        return
    rows = measure(
        args.variants.split(","),
        [int(x) for x in args.concurrency.split(",")],
        args.duration,
        args.chunks,
        parse_trees(args.trees) or None,
    )
    if args.json:
        for row in rows:
            print(json.dumps({"machine": machine(), **row}))
        return
    print(f"machine: {machine()}")
    print(markdown_table(table_rows(rows)))


if __name__ == "__main__":
    main()
