"""A local tritonserver that dies takes its Python-backend stubs and their shared memory along
(gpu_container/triton/server_group.py), while the process that started it runs on."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpu_container.triton.cpu.repository import render_cpu_repository
from gpu_container.triton.launcher import TritonProcess, start_local_triton
from tests.support.live_server import demo_model_dir
from tests.support.triton_server import ENGINE_CONFIG

# The stub's own parent watch, had it worked, ends it within a second of its server's end.
GONE_TIMEOUT_S = 10.0


@pytest.fixture
def server(tmp_path: Path) -> Iterator[TritonProcess]:
    process = start_local_triton(render_cpu_repository(tmp_path / "repo", demo_model_dir(), ENGINE_CONFIG))
    try:
        yield process
    finally:
        process.stop()


def _stat(pid: int) -> list[str] | None:
    """/proc/PID/stat's fields after the command name: state, ppid, pgrp, ...; None once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None


def _group(pgid: int) -> list[int]:
    """The running (not zombie) processes of process group `pgid`."""
    members = []
    for entry in Path("/proc").iterdir():
        if (
            entry.name.isdigit()
            and (stat := _stat(int(entry.name)))
            and stat[0] != "Z"
            and stat[2] == str(pgid)
        ):
            members.append(int(entry.name))
    return members


def _shm_regions(pids: list[int]) -> set[Path]:
    """The /dev/shm files these processes map: each stub's region shared with its server."""
    regions = set()
    for pid in pids:
        for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
            if " /dev/shm/" in line:
                regions.add(Path(line[line.index("/dev/shm/") :].removesuffix(" (deleted)")))
    return regions


def _stubs(server: TritonProcess) -> tuple[list[int], set[Path]]:
    pid = server.process.pid
    stubs = [member for member in _group(pid) if member != pid]
    regions = _shm_regions(stubs)
    assert stubs and regions, "the model's stub should be running, sharing memory with tritonserver"
    return stubs, regions


def _kill_and_wait(pids: list[int]) -> None:
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + GONE_TIMEOUT_S
    while any((stat := _stat(pid)) and stat[0] != "Z" for pid in pids):
        assert time.monotonic() < deadline, "a process outlived SIGKILL"
        time.sleep(0.01)  # a process's end is no event to wait on: /proc is polled


def test_a_tritonserver_that_dies_on_its_own_takes_its_stubs_and_their_memory_along(
    server: TritonProcess,
) -> None:
    """Killed as the OOM killer would, without a word to the edge that started it. Regression: the
    edge reaped it only at its own stop, and meanwhile the stub, whose watch on its parent takes an
    unreaped one for alive, kept running under init with the model's memory and its region."""
    pgid = server.process.pid
    _, regions = _stubs(server)

    os.kill(pgid, signal.SIGKILL)

    deadline = time.monotonic() + GONE_TIMEOUT_S
    while (left := _group(pgid)) or (kept := [r for r in regions if r.exists()]):
        assert time.monotonic() < deadline, f"outlived tritonserver: processes {left}, regions {kept}"
        time.sleep(0.02)  # nothing tells this process of another's end or a file's removal


def test_a_killed_servers_shared_memory_goes_though_its_stub_died_first(server: TritonProcess) -> None:
    """A stub that dies (here SIGKILLed, as tests/triton/test_dead_stub.py does) leaves its region to
    its server, and a SIGKILLed server removes none: each such run left a region in /dev/shm."""
    stubs, regions = _stubs(server)
    _kill_and_wait(stubs)
    _kill_and_wait([server.process.pid])

    server.stop()

    assert [r for r in regions if r.exists()] == []
