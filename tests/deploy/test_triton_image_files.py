"""The Triton image copies the project's files one by one (gpu_container/triton/Dockerfile): every
module it runs must find the project's modules it imports among them. No Docker daemon runs here,
so the image's tree is laid out from its COPY lines, and each module it holds is imported there by a
Python that sees only that tree and the installed packages (no site hooks, so not this checkout)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from tests.deploy.documented import REPO, parse_dockerfile

OWN_PACKAGES = ("gpu_container", "edge", "limiter", "client", "bench", "tests")

_CHECK = f"""
import importlib, json, sys
OWN_PACKAGES = {OWN_PACKAGES!r}
missing = {{}}
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as exc:
        # The image's own packages (TensorRT-LLM, torch) are not installed here: only the project's
        # missing modules count.
        if (exc.name or "").split(".")[0] in OWN_PACKAGES:
            missing[name] = exc.name
print(json.dumps(missing))
"""


def _lay_out(image_root: Path) -> Path:
    """The image's WORKDIR with what its COPY lines put there (sources from this checkout)."""
    dockerfile = parse_dockerfile(REPO / "gpu_container" / "triton" / "Dockerfile")
    workdir = image_root / dockerfile.all("WORKDIR")[-1].lstrip("/")
    for args in dockerfile.all("COPY"):
        *sources, dest = args.split()
        target = workdir / dest
        for source in sources:
            path = REPO / source
            if path.is_dir():
                shutil.copytree(path, target, dirs_exist_ok=True)
            else:
                target.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, target / path.name)
    return workdir


def test_every_module_the_triton_image_holds_imports_the_project_files_it_needs(tmp_path: Path) -> None:
    workdir = _lay_out(tmp_path)
    modules = sorted(
        ".".join(path.relative_to(workdir).with_suffix("").parts).removesuffix(".__init__")
        for path in workdir.rglob("*.py")
    )
    assert "gpu_container.triton.entrypoint" in modules  # the image's CMD
    site_packages = sysconfig.get_paths()["purelib"]
    result = subprocess.run(
        [sys.executable, "-S", "-c", _CHECK, *modules],
        cwd=tmp_path,
        env={"PYTHONPATH": f"{workdir}:{site_packages}", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert json.loads(result.stdout.splitlines()[-1]) == {}
