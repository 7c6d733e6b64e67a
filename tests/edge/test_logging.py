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
