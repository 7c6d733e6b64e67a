"""dynalite (a DynamoDB-compatible server on Node.js, in memory) installed into .floodgate/node/ and
started on a loopback port. Missing node/npm: the caller skips.

`make test` runs the tests in several processes (pytest-xdist): the install holds a file lock, so
two of them never run `npm install` into the same folder at once."""

from __future__ import annotations

import fcntl
import queue
import shutil
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support.ports import free_port

REPO = Path(__file__).resolve().parents[2]
NODE_DIR = REPO / ".floodgate" / "node"
CLI = NODE_DIR / "node_modules" / "dynalite" / "cli.js"


class DynaliteUnavailable(Exception):
    """Why dynalite cannot run here (the tests skip with this reason)."""


def ensure_installed() -> str:
    """Path of the node binary, after installing dynalite if needed."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        raise DynaliteUnavailable("node/npm not installed (make system-deps installs them)")
    NODE_DIR.mkdir(parents=True, exist_ok=True)
    # Checked under the lock: npm writes cli.js before the rest of the package is in place.
    with (NODE_DIR / ".install.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if CLI.exists():
            return node
        done = subprocess.run(
            [npm, "install", "--prefix", str(NODE_DIR), "--no-audit", "--no-fund", "dynalite@4"],
            capture_output=True,
            text=True,
            timeout=300,
        )
        if done.returncode != 0 or not CLI.exists():
            raise DynaliteUnavailable(f"npm install dynalite@4 failed: {done.stderr.strip()[-500:]}")
    return node


@contextmanager
def running_dynalite() -> Iterator[str]:
    """Start dynalite on a free loopback port; yields its endpoint URL once it listens."""
    node = ensure_installed()
    port = free_port()
    proc = subprocess.Popen(
        [node, str(CLI), "--host", "127.0.0.1", "--port", str(port), "--createTableMs", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(
        target=lambda: lines.put(proc.stdout.readline() if proc.stdout else ""), daemon=True
    ).start()
    try:
        first = lines.get(timeout=30)
        if "listening" not in first.lower():
            raise RuntimeError(f"dynalite did not start: {first!r}")
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
