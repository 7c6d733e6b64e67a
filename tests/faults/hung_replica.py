"""A replica address that accepts TCP connections and never answers a byte: a hung Triton replica
(its gRPC handshake and its metrics page both wait forever)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def hung_address() -> Iterator[str]:
    """`127.0.0.1:PORT`, served by a listener that accepts and holds every connection, silent."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:  # the listener closed: the test is over
                return
            held.append(conn)

    thread = threading.Thread(target=accept, name="hung-replica", daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        listener.shutdown(socket.SHUT_RDWR)
        listener.close()
        thread.join(5)
        for conn in held:
            conn.close()
