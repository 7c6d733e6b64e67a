"""Dockerfile.edge cannot be built here (no Docker engine): check what it must say."""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) per instruction, continuation lines joined, comments dropped."""
    text = (ROOT / "Dockerfile.edge").read_text().replace("\\\n", " ")
    lines = [line.strip() for line in text.splitlines()]
    pairs = [line.split(maxsplit=1) for line in lines if line and not line.startswith("#")]
    return [(pair[0].upper(), pair[1] if len(pair) > 1 else "") for pair in pairs]


def _final_stage() -> list[tuple[str, str]]:
    instructions = _instructions()
    last_from = max(i for i, (op, _) in enumerate(instructions) if op == "FROM")
    return instructions[last_from:]


def test_runs_on_python_slim_as_a_non_root_user() -> None:
    froms = [args for op, args in _instructions() if op == "FROM"]
    assert froms and all(args.startswith("python:3.11-slim") for args in froms)
    users = [args for op, args in _final_stage() if op == "USER"]
    assert users and users[-1] not in ("root", "0") and not users[-1].startswith(("root:", "0:"))


def test_installs_the_package_without_dev_extras() -> None:
    runs = " ".join(args for op, args in _instructions() if op == "RUN")
    assert "pip install --no-cache-dir ." in runs
    assert "[dev" not in runs and "[triton" not in runs and "requirements" not in runs


def test_serves_the_mounted_settings_on_port_8000_with_a_health_check() -> None:
    stage = _final_stage()
    final = dict(stage)
    assert json.loads(final["CMD"]) == ["floodgate", "serve", "--config", "/etc/floodgate/edge.toml"]
    assert final["EXPOSE"] == "8000"
    # The settings CMD serves, whose ports the health check reads (a fixed :8000 probed the public
    # port whatever [server] port said, and failed a live edge mid-drain).
    options, _, check = final["HEALTHCHECK"].partition(" CMD ")
    assert "--timeout=" in options
    assert json.loads(check) == ["python", "-m", "edge.healthcheck", "--config", "/etc/floodgate/edge.toml"]
    assert any(args.endswith("/opt/floodgate/model/") for op, args in stage if op == "COPY")


def test_copies_only_paths_that_exist_and_are_not_ignored() -> None:
    ignored = {line.strip().rstrip("/") for line in (ROOT / ".dockerignore").read_text().splitlines()}
    assert {".git", ".venv", ".floodgate"} <= ignored
    for op, args in _instructions():
        if op == "COPY" and not args.startswith("--from") and "${" not in args:
            for source in args.split()[:-1]:
                assert (ROOT / source).exists(), source
                assert source.rstrip("/") not in ignored, source
