"""The open-file limit: raised to the hard limit at start, and the streams it can hold."""

from __future__ import annotations

import resource
import subprocess
import sys

from edge.open_files import RESERVED_FDS, connection_cap, stream_cap

RAISE_AND_PRINT = "from edge.open_files import raise_open_files_limit; print(raise_open_files_limit())"


def _low_soft_limit() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))


def test_a_process_started_with_a_low_soft_limit_raises_it_to_the_hard_one() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            RAISE_AND_PRINT + "; import resource; print(resource.getrlimit(resource.RLIMIT_NOFILE)[0])",
        ],
        preexec_fn=_low_soft_limit,
        capture_output=True,
        text=True,
        check=True,
    )
    returned, in_force = (int(line) for line in child.stdout.split())
    assert returned == in_force
    assert in_force == (hard if hard != resource.RLIM_INFINITY else 1 << 20)
    assert in_force > 256


def test_streams_are_held_to_what_the_limit_leaves_after_the_reserve() -> None:
    # Through Triton a stream holds two sockets: the client's and the replica's.
    assert stream_cap(10_000, 2, RESERVED_FDS + 2 * 500) == 500
    assert stream_cap(10_000, 1, RESERVED_FDS + 500) == 500
    # Room to spare: the configured cap stands.
    assert stream_cap(10_000, 2, 65_535) == 10_000
    assert stream_cap(10_000, 2, resource.RLIM_INFINITY) == 10_000
    # Never below one stream, however small the limit.
    assert stream_cap(10_000, 2, 100) == 1


def test_connections_leave_the_streams_replica_sockets_free() -> None:
    # 500 streams through Triton: 500 replica sockets, and the rest of the room for connections.
    assert connection_cap(RESERVED_FDS + 2 * 500 + 300, 500, 2) == 500 + 300
    assert connection_cap(RESERVED_FDS + 800, 500, 1) == 800
    assert connection_cap(resource.RLIM_INFINITY, 10_000, 2) is None
    # Never fewer than the streams stream_cap allowed.
    assert connection_cap(100, 1, 2) == 1
