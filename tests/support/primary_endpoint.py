"""A TCP proxy standing in for a replication group's primary endpoint (ElastiCache's, a Sentinel
setup's DNS name): each new connection goes to whichever server is primary now (`point_at`), while
a connection opened before a failover stays with the server it reached, demoted to a replica. That
server then answers every write READONLY until the client reconnects, which it must do by itself.

    with primary_endpoint(a.port) as endpoint:   # endpoint.url; endpoint.point_at(b.port)
    with failover_pair() as (old, new, endpoint):  # two servers of their own, `old` primary
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager

from tests.support.redis_server import RedisServer, start_redis
from tests.support.tcp_proxy import TcpProxy, pipe, running


class PrimaryEndpoint(TcpProxy):
    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def point_at(self, port: int) -> None:
        """Connections from now on go to `port` (the endpoint's name now resolves to it)."""
        self._upstream_port = port

    def _handle(self, client: socket.socket, number: int) -> None:
        with client, socket.create_connection(("127.0.0.1", self._upstream_port)) as upstream:
            back = threading.Thread(target=pipe, args=(upstream, client), daemon=True)
            back.start()
            pipe(client, upstream)
            with contextlib.suppress(OSError):  # the server may have closed it already
                upstream.shutdown(socket.SHUT_RDWR)
            back.join()


def primary_endpoint(upstream_port: int) -> AbstractContextManager[PrimaryEndpoint]:
    return running(PrimaryEndpoint(upstream_port))


@contextlib.contextmanager
def failover_pair() -> Iterator[tuple[RedisServer, RedisServer, PrimaryEndpoint]]:
    """Two redis-servers of the caller's own and the endpoint naming the first (`old`) until a test
    fails it over to `new` (`point_at`, then REPLICAOF on `old`); both killed on the way out."""
    old, new = start_redis(), start_redis()
    try:
        with primary_endpoint(old.port) as endpoint:
            yield old, new, endpoint
    finally:
        old.kill()
        new.kill()
