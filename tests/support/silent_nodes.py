"""Redis servers that stop answering without refusing: each process SIGSTOPped, so connections
stay open and new ones are still accepted by the kernel, but nothing is ever read or answered (a
frozen host, a path that drops packets). Unlike a killed server, a client learns nothing but its
timeouts.

    with silenced(cluster.nodes):
        ...   # every node silent here, answering again after
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from tests.support.redis_server import RedisServer


@contextmanager
def silenced(nodes: Sequence[RedisServer]) -> Iterator[None]:
    for node in nodes:
        os.kill(node.process.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for node in nodes:
            os.kill(node.process.pid, signal.SIGCONT)
