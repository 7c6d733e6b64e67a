"""A request's info line through the configured structlog chain, without structlog's per-call
layers.

Every request writes one line (`chat_completion`), so its cost is part of a stream's set-up:
`log.info(event, **fields)` first passes a lazy proxy, the filtering wrapper's method and
`_proxy_to_logger` (the fields repacked as keywords twice, the bound context copied), which was
about half of the line's 15 µs (docs/bench-streams.md, sixth pass). `info_line` runs the same
processors, in the same order, on the same event dict (the fields, then `event`) and hands what
they return to the same logger, so the line is byte for byte structlog's. Only while structlog
runs the configuration `configure_logging` made (edge/logging_setup.py): under any other (a test
capturing logs, an app embedding the edge) it is `log.info` itself.
"""

from __future__ import annotations

from typing import Any

import structlog
from structlog.typing import Processor, WrappedLogger

_processors: list[Processor] | None = None
_logger: WrappedLogger = None
_wrapper_class: Any = None


def use_chain(processors: list[Processor], logger: WrappedLogger, wrapper_class: Any) -> None:
    """`configure_logging`'s chain: the list it gave structlog (the same object, which structlog's
    own log capture edits in place), a logger from its factory, and its wrapper class (None: the
    level filters info lines out, and `info_line` leaves them to structlog)."""
    global _processors, _logger, _wrapper_class
    _processors, _logger, _wrapper_class = processors, logger, wrapper_class


def info_line(log: Any, event: str, fields: dict[str, Any]) -> None:
    """`log.info(event, **fields)` for a logger with no bound values (`structlog.get_logger(name)`);
    `fields` is taken over."""
    processors = _processors
    config = structlog.get_config()
    if (
        processors is None
        or _wrapper_class is None
        or config["processors"] is not processors
        or config["wrapper_class"] is not _wrapper_class
    ):
        log.info(event, **fields)
        return
    fields["event"] = event
    event_dict: Any = fields
    try:
        for processor in processors:
            event_dict = processor(_logger, "info", event_dict)
    except structlog.DropEvent:
        return
    _logger.msg(event_dict)


# Refusals whose 5xx status is HTTP's name for them, not the server's trouble: the client caused
# them all the same (501: a transfer coding it chose that nothing here decodes; 505: a version of
# HTTP it chose), and a warning per such request would page an operator for what one client sends.
CLIENT_CAUSED_5XX = frozenset({"unsupported_transfer_coding", "http_version_not_supported"})


def refusal_line(log: Any, event: str, fields: dict[str, Any]) -> None:
    """A refused request's one line: info for what the client caused (a 4xx, and the 5xx codes of
    CLIENT_CAUSED_5XX), a warning for the server's own trouble (a store down, no replica), which an
    operator watches for. `fields["status"]` and `fields["code"]`."""
    if fields["status"] < 500 or fields["code"] in CLIENT_CAUSED_5XX:
        info_line(log, event, fields)
    else:
        log.warning(event, **fields)
