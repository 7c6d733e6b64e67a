"""Counting a process's own TCP connections from /proc: what the kernel holds, whoever in the
process opened them, with no tool to install."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def established_to(port: int) -> int:
    """This process's established TCP connections to `port` on any address."""
    inodes = set()
    for fd in Path("/proc/self/fd").iterdir():
        with contextlib.suppress(OSError):
            if (target := os.readlink(fd)).startswith("socket:["):
                inodes.add(target.removeprefix("socket:[").removesuffix("]"))
    count = 0
    tables = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))
    for line in (row for table in tables for row in table.read_text().splitlines()[1:]):
        fields = line.split()
        remote_port, state, inode = int(fields[2].rsplit(":", 1)[1], 16), fields[3], fields[9]
        count += remote_port == port and state == "01" and inode in inodes
    return count
