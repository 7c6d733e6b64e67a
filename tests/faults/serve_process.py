"""A real `floodgate serve` process on loopback ports, for the drills that signal or overload it:
bench/drill_serve.py's (the long drills in bench/drills.py use the same), with the test session's
demo model."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.drill_serve import ServeProcess
from bench.drill_serve import serve_process as _serve_process
from tests.support.live_server import demo_model_dir

__all__ = ["ServeProcess", "serve_process"]


@contextmanager
def serve_process(
    tmp_path: Path, sections: dict[str, dict[str, object]], popen: dict[str, Any] | None = None
) -> Iterator[ServeProcess]:
    """`floodgate serve` with `sections` over the test defaults; killed if still running at the end.
    `popen`: more subprocess.Popen arguments."""
    with _serve_process(tmp_path, sections, demo_model_dir(), popen) as server:
        yield server
