"""structlog for a served edge: one JSON object per line on stdout, stdlib loggers (uvicorn,
Litestar) included.

Tracebacks are rendered as plain text (`format_exc_info`), never with local variables: a frame of
the engine holds the KV cache, a frame of the pipeline the prompt and the API key.

What Python itself would print to stderr goes through the same chain: a warning (`warnings.warn`,
a library's deprecation) and an exception that ends a thread (a worker thread's, a library's) were
multi-line text a log shipper splits into one bogus event per line, without the request or worker
they came from.

Every request writes one line, so its cost is part of a stream's set-up: the JSON is msgspec's
(compact, about a tenth of `json.dumps`'s time) and the timestamp formats its date and second
once per second, not per line (structlog's TimeStamper builds a datetime for each). Together they
took the request's log line from about a tenth of a one-token stream's CPU to a third of that.
"""

from __future__ import annotations

import codecs
import io
import logging
import sys
import threading
import time
from typing import Any

import msgspec
import structlog
from structlog.typing import EventDict, Processor, WrappedLogger

from edge.log_line import use_chain
from gpu_container.plain_logging import WorkerStamp

_encoder = msgspec.json.Encoder(enc_hook=repr)  # anything JSON has no type for: its repr


def _dumps(event: Any, **_: Any) -> str:
    return _encoder.encode(event).decode()


class IsoUtcStamper:
    """`timestamp`: the time as structlog's `TimeStamper(fmt="iso", utc=True)` writes it
    (2026-11-30T16:25:44.530900Z), with the date and second formatted once per second."""

    __slots__ = ("_prefix", "_second")

    def __init__(self) -> None:
        self._second = -1
        self._prefix = ""

    def __call__(self, logger: WrappedLogger, name: str, event: EventDict) -> EventDict:
        now = time.time()
        second = int(now)
        if second != self._second:
            self._prefix = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
            self._second = second
        event["timestamp"] = f"{self._prefix}.{int((now - second) * 1e6):06d}Z"
        return event


def _utf8_stdout() -> None:
    """stdout in UTF-8, as JSON is, whatever the locale: under a C locale without Python's UTF-8
    coercion it was ASCII, and a line with a character beyond it (the path of a 404 for `/café`, a
    user so named) raised UnicodeEncodeError inside the request it described (uvicorn's plain-text
    500, no line)."""
    if isinstance(sys.stdout, io.TextIOWrapper) and codecs.lookup(sys.stdout.encoding).name != "utf-8":
        sys.stdout.reconfigure(encoding="utf-8")


def configure_logging(level: int = logging.INFO, worker: int | None = None) -> None:
    """`worker`: this process's index among `serve --workers N`'s, stamped on every line."""
    _utf8_stdout()
    shared: list[Processor] = [
        structlog.contextvars.merge_contextvars,  # request_id, bound by the pipeline per request
        structlog.processors.add_log_level,
        IsoUtcStamper(),
    ]
    if worker is not None:
        shared.append(WorkerStamp(worker))
    processors: list[Processor] = [
        *shared,
        structlog.processors.format_exc_info,
        structlog.processors.JSONRenderer(serializer=_dumps),
    ]
    wrapper_class = structlog.make_filtering_bound_logger(level)
    # One write per line (PrintLogger writes the line and its newline apart: two syscalls).
    logger_factory = structlog.WriteLoggerFactory(sys.stdout)
    structlog.configure(
        processors=processors,
        wrapper_class=wrapper_class,
        logger_factory=logger_factory,
        cache_logger_on_first_use=True,
    )
    use_chain(processors, logger_factory(), wrapper_class if level <= logging.INFO else None)
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[*shared, structlog.stdlib.add_logger_name],
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.format_exc_info,
                structlog.processors.JSONRenderer(serializer=_dumps),
            ],
        )
    )
    root = logging.getLogger()
    root.handlers = [handler]
    root.setLevel(level)
    logging.captureWarnings(True)  # the `py.warnings` logger, through the handler above
    threading.excepthook = _log_thread_exception


def _log_thread_exception(args: threading.ExceptHookArgs) -> None:
    if args.exc_type is SystemExit:
        return  # as the default hook: a thread's exit, not a failure
    thread = None if args.thread is None else args.thread.name
    structlog.get_logger("floodgate.thread").error(
        "thread_failed", thread=thread, exc_info=(args.exc_type, args.exc_value, args.exc_traceback)
    )
