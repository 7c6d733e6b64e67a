"""A process that owns a local tritonserver, as an edge with `--upstream local` does:
`python -m tests.triton.triton_owner WORKDIR`. Starts it from a thread that then ends (the edge
starts it through anyio's worker threads, which end when idle), prints `triton_pid=PID` once it is still
ready after that thread ended, and waits to be killed."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import httpx

from gpu_container.triton.cpu.repository import render_cpu_repository
from gpu_container.triton.launcher import TritonProcess, start_local_triton
from tests.support.live_server import demo_model_dir
from tests.support.triton_server import ENGINE_CONFIG


def main(workdir: Path) -> None:
    repository = render_cpu_repository(workdir / "repo", demo_model_dir(), ENGINE_CONFIG)
    started: list[TritonProcess] = []
    starter = threading.Thread(target=lambda: started.append(start_local_triton(repository)))
    starter.start()
    starter.join()
    (server,) = started
    # The starting thread has ended: the server must not have been taken along with it.
    assert httpx.get(f"{server.http_url}/v2/health/ready", timeout=10).status_code == 200
    print(f"triton_pid={server.process.pid}", flush=True)
    sys.stdin.readline()  # the test kills this process before it writes anything


if __name__ == "__main__":
    main(Path(sys.argv[1]))
