"""structlog for the GPU side (container start-up, the CPU model inside tritonserver, the engine
process beside the edge): one JSON object per line, tracebacks as plain text.

structlog's default console renderer prints rich tracebacks with every frame's local variables; a
frame of the engine holds KV-cache arrays and prompt token ids, which must never reach a log. The
edge has its own setup (edge/logging_setup.py); the GPU image does not ship the edge package.
"""

from __future__ import annotations

import logging
import sys

import structlog


def configure_plain_logging(level: int = logging.INFO) -> None:
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(sys.stdout),
        cache_logger_on_first_use=True,
    )
