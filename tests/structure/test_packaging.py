"""What each distribution installs: the client alone pulls httpx only; the server's distribution
ships edge/, limiter/ and gpu_container/ (no top-level `client` or `bench`) and no test tools.

Read from the pyproject files and the sources, so it holds without building or installing anything,
but for the client's typing marker: which files a wheel gets is setuptools' to say, so that test runs
its build_py (offline, on a copy of client/). `pip install ./client` in a fresh venv is the by-hand
check (README, client/README.md).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from fnmatch import fnmatch
from pathlib import Path

import pytest

from tests.structure.imports import ROOT, imports_in

CLIENT_DIR = ROOT / "client"
# What the client may import besides the standard library and itself: httpx and the anyio it
# depends on (and the client names too, since it imports it).
CLIENT_THIRD_PARTY = {"httpx", "anyio"}
SERVER_ONLY = {"numpy", "tritonclient", "boto3"}
DEV_TOOLS = {"pytest", "mypy", "ruff", "hypothesis", "moto", "playwright", "schemathesis", "openai"}


def _project(path: Path) -> dict[str, object]:
    project: dict[str, object] = tomllib.loads(path.read_text())["project"]
    return project


def _names(requirements: object) -> set[str]:
    assert isinstance(requirements, list)
    return {re.split(r"[\s\[<>=!~;]", str(r), maxsplit=1)[0].lower() for r in requirements}


def test_the_client_declares_httpx_and_anyio_only() -> None:
    project = _project(CLIENT_DIR / "pyproject.toml")
    assert project["name"] == "floodgate-client"
    assert _names(project["dependencies"]) == CLIENT_THIRD_PARTY


def test_the_client_imports_nothing_it_does_not_declare() -> None:
    sources = sorted((CLIENT_DIR / "floodgate_client").glob("*.py"))
    assert sources
    undeclared = sorted(
        f"{path.name}: {name}"
        for path in sources
        for name in imports_in(path.read_text(), "floodgate_client")
        if (top := name.split(".")[0]) not in sys.stdlib_module_names
        and top not in CLIENT_THIRD_PARTY | {"floodgate_client"}
    )
    assert undeclared == []


def test_the_server_distribution_ships_no_top_level_client_or_bench() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    # setuptools' find matches its include patterns against package names; the top-level ones are
    # the root's folders with an __init__.py (bench/ has one; the client's package is in client/).
    tops = {
        d.name
        for d in ROOT.iterdir()
        if (d / "__init__.py").is_file() and any(fnmatch(d.name, pattern) for pattern in config["include"])
    }
    assert tops == {"edge", "limiter", "gpu_container"}


def test_the_runtime_set_holds_no_test_tools_and_the_client_is_separate() -> None:
    runtime = _names(_project(ROOT / "pyproject.toml")["dependencies"])
    assert runtime.isdisjoint(DEV_TOOLS)
    assert "floodgate-client" in runtime  # `floodgate chat`, from the client's own distribution
    assert SERVER_ONLY <= runtime  # the server needs them; the client must not pull them


def test_the_client_wheel_carries_its_py_typed_marker(tmp_path: Path) -> None:
    """An application's mypy reads an installed package's annotations only with a py.typed (PEP 561):
    without it, everything from floodgate_client was Any to the application's type check."""
    pytest.importorskip("setuptools", reason="setuptools builds the client's wheel")
    source = tmp_path / "client"
    shutil.copytree(CLIENT_DIR, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    built = tmp_path / "lib"
    subprocess.run(
        [sys.executable, "-c", "from setuptools import setup; setup()", "-q", "build_py", "-d", str(built)],
        cwd=source,
        check=True,
        capture_output=True,
        timeout=120,
    )
    assert (built / "floodgate_client" / "__init__.py").is_file()
    assert (built / "floodgate_client" / "py.typed").is_file()
