"""structlog for the GPU side (container start-up, the CPU model inside tritonserver, the engine
process beside the edge): one JSON object per line, tracebacks as plain text.

structlog's default console renderer prints rich tracebacks with every frame's local variables; a
frame of the engine holds KV-cache arrays and prompt token ids, which must never reach a log. The
edge has its own setup (edge/logging_setup.py); the GPU image does not ship the edge package.
"""

from __future__ import annotations

import logging
import os
import sys

import structlog
from structlog.typing import EventDict, Processor, WrappedLogger

# Set by `floodgate serve --workers N` in each worker (edge/workers.py) to its index: the engine
# process a worker starts, and a local tritonserver's model, inherit it and stamp their lines with
# `worker` as the edge's own are (edge/logging_setup.py), on the standard output they all share.
WORKER_ENV = "FLOODGATE_WORKER"


class WorkerStamp:
    """`worker`: which process of `floodgate serve --workers N` wrote the line, or started the engine
    that did. They share one standard output (and one log group), where a line said nothing of the
    worker it came from. The edge's logging (edge/logging_setup.py) stamps with it too."""

    __slots__ = ("_index",)

    def __init__(self, index: int) -> None:
        self._index = index

    def __call__(self, logger: WrappedLogger, name: str, event: EventDict) -> EventDict:
        event["worker"] = self._index
        return event


def configure_plain_logging(level: int = logging.INFO) -> None:
    processors: list[Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    worker = os.environ.get(WORKER_ENV, "")
    if worker.isdigit():
        processors.append(WorkerStamp(int(worker)))
    structlog.configure(
        processors=[
            *processors,
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(sys.stdout),
        cache_logger_on_first_use=True,
    )
