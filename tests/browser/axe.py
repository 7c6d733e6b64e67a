"""axe-core (Deque's accessibility rules, as browser extensions and CI audits run them) installed
from npm into .floodgate/axe/ and run inside the real page. Missing npm: the caller skips, as the
dynalite tests do (make system-deps installs it).

`make test` runs the tests in several processes (pytest-xdist): the install holds a file lock, so
two of them never run `npm install` into the same folder at once."""

from __future__ import annotations

import fcntl
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page

REPO = Path(__file__).resolve().parents[2]
AXE_DIR = REPO / ".floodgate" / "axe"
AXE_JS = AXE_DIR / "node_modules" / "axe-core" / "axe.min.js"
# The impacts that a screen-reader or low-vision user is stopped or badly slowed by: axe's own
# split between what blocks a user and what merely annoys one.
BLOCKING = ("serious", "critical")


def axe_source() -> str:
    """axe.min.js, installed first if needed; skips the test where npm is missing or fails."""
    npm = shutil.which("npm")
    if npm is None:
        pytest.skip("NOT RUN: npm is not installed, so axe-core is not (make system-deps installs npm)")
    AXE_DIR.mkdir(parents=True, exist_ok=True)
    with (AXE_DIR / ".install.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not AXE_JS.exists():
            done = subprocess.run(
                [npm, "install", "--prefix", str(AXE_DIR), "--no-audit", "--no-fund", "axe-core@4"],
                capture_output=True,
                text=True,
                timeout=300,
            )
            if done.returncode != 0 or not AXE_JS.exists():
                pytest.skip(f"NOT RUN: npm install axe-core@4 failed: {done.stderr.strip()[-500:]}")
    return AXE_JS.read_text()


def blocking_violations(page: Page, rules: list[str] | None = None) -> list[str]:
    """axe's serious and critical violations on the page as it stands, one line per element
    ("rule: element: why"); only `rules` where given. Put in with evaluate, not a script tag: the
    page's Content-Security-Policy refuses inline scripts, and is left on to audit the page as
    served."""
    if not page.evaluate("typeof window.axe !== 'undefined'"):
        page.evaluate(axe_source() + "\n;undefined")
    options: dict[str, Any] = {"resultTypes": ["violations"]}
    if rules is not None:
        options["runOnly"] = {"type": "rule", "values": rules}
    violations = page.evaluate(
        """async (options) => (await axe.run(document, options)).violations.flatMap((v) =>
             v.nodes.map((n) => ({ impact: v.impact,
                                   line: v.id + ": " + n.target.join(" ") + ": " + n.failureSummary })))""",
        options,
    )
    return [v["line"] for v in violations if v["impact"] in BLOCKING]
