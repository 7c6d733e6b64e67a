"""The served edge's logs: JSON lines, the request id bound, tracebacks without local variables."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import logging
    import structlog
    from edge.logging_setup import configure_logging

    configure_logging()
    structlog.contextvars.bind_contextvars(request_id="chatcmpl-test")

    def step():
        kv_cache = "SECRET-" + "LOCAL"  # a local a rich traceback would print
        raise RuntimeError("engine step failed")

    try:
        step()
    except RuntimeError:
        structlog.get_logger("floodgate.test").exception("step_failed")
        logging.getLogger("uvicorn.error").exception("asgi_failed")
    """
)


def test_logs_are_json_with_the_request_id_and_plain_tracebacks() -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "SECRET-LOCAL" not in done.stdout + done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert [line["event"] for line in lines] == ["step_failed", "asgi_failed"]
    for line in lines:
        assert line["request_id"] == "chatcmpl-test" and line["level"] == "error"
        assert line["exception"].startswith("Traceback") and "engine step failed" in line["exception"]
    assert lines[1]["logger"] == "uvicorn.error"


LINE_SCRIPT = textwrap.dedent(
    """
    import time

    import structlog
    import structlog.testing
    from edge.log_line import info_line
    from edge.logging_setup import configure_logging

    time.time = lambda: 1764520000.123456  # both lines get one timestamp
    configure_logging()
    structlog.contextvars.bind_contextvars(request_id="chatcmpl-test", route="chat")
    log = structlog.get_logger("floodgate.request")

    def fields():
        return {"request_id": "chatcmpl-test", "user": "u", "stream": True, "ttft_ms": None, "n": 3}

    log.info("chat_completion", **fields())
    info_line(log, "chat_completion", fields())
    with structlog.testing.capture_logs() as captured:
        info_line(log, "chat_completion", fields())  # captured, not written
    assert [c["event"] for c in captured] == ["chat_completion"], captured
    info_line(log, "chat_completion", fields())  # the capture is over: written again
    """
)


def test_the_request_line_is_byte_for_byte_structlogs_and_honours_a_log_capture() -> None:
    done = subprocess.run([sys.executable, "-c", LINE_SCRIPT], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 3 and lines[0] == lines[1] == lines[2], lines
    assert json.loads(lines[0])["route"] == "chat"  # the bound context merged in


WARNING_SCRIPT = textwrap.dedent(
    """
    import threading
    import warnings

    from edge.logging_setup import configure_logging

    configure_logging(worker=1)
    warnings.warn("this call is deprecated", DeprecationWarning, stacklevel=1)

    def fails():
        raise RuntimeError("the worker thread failed")

    thread = threading.Thread(target=fails, name="key-store")
    thread.start()
    thread.join()
    """
)


def test_warnings_and_a_threads_uncaught_exception_are_json_lines_too() -> None:
    """Python wrote both to stderr as several lines of plain text: a log shipper made one event of
    each line, with no worker or level to find them by."""
    done = subprocess.run(
        [sys.executable, "-W", "always", "-c", WARNING_SCRIPT], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert [(line["logger"] if "logger" in line else None, line["level"]) for line in lines] == [
        ("py.warnings", "warning"),
        (None, "error"),
    ]
    warned, failed = lines
    assert "this call is deprecated" in warned["event"] and warned["worker"] == 1
    assert failed["event"] == "thread_failed" and failed["thread"] == "key-store" and failed["worker"] == 1
    assert "the worker thread failed" in failed["exception"]
