"""How many streams the process's open-file limit lets it hold, once the limit is raised.

Every open stream holds its client's socket, and on a Triton replica one more: the edge reads each
stream on an HTTP connection of its own (edge/upstreams/triton_sse.py), where gRPC carried them all
on one. A process out of descriptors fails to accept a client (a reset, not an answer) or to reach a
replica. So the soft limit is raised to the hard one, and `[server] max_open_streams` is held to what
the limit leaves after a reserve: past that, the stream gate answers 429 with Retry-After
(edge/stream_gate.py). ECS on Fargate gives 65,535 (iac/modules/edge_service sets it too): 32,000
streams through Triton, three times the default `max_open_streams`.

Connections are held to what the limit leaves too (`connection_cap`): a connection costs a
descriptor before it is a stream, idle or waiting for its headers, and nothing else bounded them.
Out of descriptors, the event loop (libuv) accepts each new client and closes it at once: no answer,
no log line, no metric (1,400 idle connections held on an edge limited to 1,400 descriptors, and not
one of 3,000 more got an answer). Past the cap a new connection is answered 503 and closed instead
(edge/connection_cap.py), while the reserve still has the descriptors for that answer.
"""

from __future__ import annotations

import resource

import structlog

log = structlog.get_logger(__name__)

# Listeners, Redis and key-store clients, log files, the engines' pipes, what libraries open, the
# operator listener's connections (at most OPS_MAX_CONNECTIONS) and the connections turned away as
# they linger (edge/connection_cap.py MAX_LINGERING).
RESERVED_FDS = 1024
# The operator listener's connections at once (a scraper, probes, an admin tool need a few): out of
# the reserve, so that a flood of them never takes what the public listener and streams need.
OPS_MAX_CONNECTIONS = 128
# Asked for when the hard limit is unlimited (the kernel's fs.nr_open caps it; 1,048,576 by default).
_UNLIMITED_TARGET = 1 << 20


def raise_open_files_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit; the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = _UNLIMITED_TARGET if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:
            log.warning("open_files_limit_not_raised", soft=soft, hard=hard, error=str(exc))
    return soft


def stream_cap(max_open_streams: int, fds_per_stream: int, limit: int) -> int:
    """`max_open_streams`, or fewer when `limit` open files cannot hold that many streams."""
    if limit == resource.RLIM_INFINITY:
        return max_open_streams
    room = max(1, (limit - RESERVED_FDS) // fds_per_stream)
    if room < max_open_streams:
        log.warning(
            "open_files_limit_caps_streams",
            open_files_limit=limit,
            fds_per_stream=fds_per_stream,
            max_open_streams=max_open_streams,
            streams=room,
        )
        return room
    return max_open_streams


def connection_cap(limit: int, streams: int, fds_per_stream: int) -> int | None:
    """The most client connections the public listener may hold at once with `limit` open files and
    at most `streams` streams (`stream_cap`), each holding `fds_per_stream` descriptors, its client's
    connection among them; None where the limit is unlimited. What the reserve leaves, less each
    stream's own replica socket: a stream's client connection is one of the connections, so idle
    ones never take the descriptors the streams' replica sockets need. Never fewer than `streams`
    (stream_cap leaves them room) nor than one."""
    if limit == resource.RLIM_INFINITY:
        return None
    return max(1, streams, limit - RESERVED_FDS - streams * (fds_per_stream - 1))
