"""The edge image serves every model terraform.tfvars.example names: the documented build puts each
model's tokenizer files where the planned settings look for them, and the task's real start command
serves them.

No Docker daemon runs here, so the image is laid out, not built: Dockerfile.edge's COPY lines applied
to a build context made as docs/deploy.md says (with several models, MODEL_DIR is a folder of one
folder per model, named as var.models names it), the build stage's `pip install ./client .` standing
as the packages' sources on PYTHONPATH. The settings are the ones Terraform renders for the example's
multi-model block (`terraform test` of the environment with that block as its terraform.tfvars,
mocked AWS provider). Then, as a task runs: `floodgate-start` (scripts/edge-start.sh) and `floodgate
serve`, as uid 10001, on a read-only root filesystem, the image's files at /opt and the task volume
at /run/floodgate, in mount, PID and network namespaces of its own (loopback only: Redis, DynamoDB and
Auto Scaling are unreachable, as the edge tolerates at start). It must answer /healthz."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.deploy.documented import REPO, parse_dockerfile
from tests.iac.hcl import EXAMPLE
from tests.iac.terraform_env import init, planned, planned_runs, require_mirror
from tests.support.live_server import demo_model_dir

UID = 10001
DOCKERFILE = REPO / "Dockerfile.edge"
# What Dockerfile.edge's build stage installs (`pip install ./client .`), by import name.
PACKAGES = {"edge": REPO / "edge", "limiter": REPO / "limiter", "gpu_container": REPO / "gpu_container"}
PACKAGES["floodgate_client"] = REPO / "client" / "floodgate_client"
# docs/deploy.md, step 3: the build argument for several models, a folder of one folder per model.
MODELS_CONTEXT = "models"

pytestmark = [
    pytest.mark.server,
    pytest.mark.skipif(
        os.geteuid() != 0 or not all(shutil.which(t) for t in ("unshare", "setpriv", "ip")),
        reason="NOT RUN: needs root, unshare, setpriv and ip for the task's namespaces and uid 10001",
    ),
]


def tfvars_example_models() -> str:
    """terraform.tfvars.example as an operator completes it for several models: its settings, and
    the commented-out models and tier_models uncommented."""
    lines = (EXAMPLE / "terraform.tfvars.example").read_text().splitlines()
    settings = [line for line in lines if line and not line.startswith("#")]
    start = next(i for i, line in enumerate(lines) if re.match(r"# models = \{", line))
    end = next(i for i, line in enumerate(lines) if re.match(r"# tier_models = ", line))
    block = [re.sub(r"^# ?", "", line) for line in lines[start : end + 1]]
    return "\n".join([*settings, *block]) + "\n"


@pytest.fixture(scope="module")
def task_environment(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """What the example's multi-model task definition gives the start script: the edge settings
    (FLOODGATE_CONFIG_TOML) and its workers (FLOODGATE_WORKERS)."""
    binary = require_mirror()
    work = tmp_path_factory.mktemp("tfvars-example")
    shutil.copytree(REPO / "iac", work / "iac", ignore=shutil.ignore_patterns(".terraform*"))
    example = work / "iac" / "envs" / "example"
    (example / "terraform.tfvars").write_text(tfvars_example_models())
    (example / "tests" / "tfvars_example.tftest.hcl").write_text(
        'mock_provider "aws" {\n  override_during = plan\n  source          = "./tests/mocks"\n}\n\n'
        'run "tfvars_example" {\n  command = plan\n}\n'
    )
    env = init(binary, example, work)
    plan = planned_runs(binary, example, env, "tests/tfvars_example.tftest.hcl")["tfvars_example"]
    task = planned(plan, "module.edge.aws_ecs_task_definition.edge")
    (container,) = json.loads(task["container_definitions"])
    environment = {e["name"]: e["value"] for e in container["environment"]}
    task = {k: v for k, v in environment.items() if k in ("FLOODGATE_CONFIG_TOML", "FLOODGATE_WORKERS")}
    # Redis is unreachable here, so a worker serves once its fleet membership falls back, [fleet]
    # stale_after_s after its start (30 s, by design; tests/membership/ test the fallback): shortened,
    # or the test waits out half a minute doing nothing.
    assert "\n[fleet]\n" in task["FLOODGATE_CONFIG_TOML"]
    task["FLOODGATE_CONFIG_TOML"] = task["FLOODGATE_CONFIG_TOML"].replace(
        "\n[fleet]\n", "\n[fleet]\nstale_after_s = 3.0\n", 1
    )
    return task


@pytest.fixture
def root() -> Iterator[Path]:
    """A folder uid 10001 can reach (pytest's own sit under a root-only 0700 folder)."""
    path = Path(tempfile.mkdtemp(prefix="floodgate-edge-image-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)


def build_context(root: Path, models: list[str]) -> Path:
    """The build context docs/deploy.md describes: MODEL_DIR holds one folder per model, named as
    var.models names it, each with the checkpoint's config and tokenizer files (no weights)."""
    context = root / "context"
    demo = demo_model_dir()
    for model in models:
        folder = context / MODELS_CONTEXT / model
        folder.mkdir(parents=True)
        for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
            shutil.copyfile(demo / name, folder / name)
    (context / "scripts").mkdir()
    shutil.copyfile(REPO / "scripts" / "edge-start.sh", context / "scripts" / "edge-start.sh")
    return context


def lay_out_image(root: Path, context: Path, build_args: dict[str, str]) -> Path:
    """The final stage's files: each COPY from the context (build arguments substituted), the
    venv's packages, made readable by all as the image's are."""
    image = root / "image"
    instructions = parse_dockerfile(DOCKERFILE).instructions
    final = instructions[max(i for i, (op, _) in enumerate(instructions) if op == "FROM") :]
    args = {}
    for op, value in final:
        if op == "ARG":
            name, _, default = value.partition("=")
            args[name] = build_args.get(name, default)
        elif op == "COPY" and not value.startswith("--from"):
            source, dest = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], value).split()
            target = image / dest.lstrip("/")
            if (context / source).is_dir():
                shutil.copytree(context / source, target, dirs_exist_ok=True)
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(context / source, target)
                target.chmod(0o755)
    site = image / "opt" / "venv" / "src"
    for name, source in PACKAGES.items():
        shutil.copytree(source, site / name, ignore=shutil.ignore_patterns("__pycache__"))
    bin_dir = image / "opt" / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    # Where the task mounts this venv's third-party packages (TASK): the venv itself may sit under a
    # folder uid 10001 cannot enter (a clone in a 0700 mktemp folder, as CI's is).
    (image / "opt" / "venv" / "site").mkdir()
    # `floodgate`, as the package's console script, on this checkout's interpreter (its real path:
    # TASK shows uid 10001 its home) with this venv's packages.
    python = os.path.realpath(sys.executable)
    (bin_dir / "floodgate").write_text(f'#!/bin/sh\nexec {python} -m edge.cli "$@"\n')
    (bin_dir / "floodgate").chmod(0o755)
    for path in [image, *image.rglob("*")]:
        path.chmod(path.stat().st_mode | (0o555 if path.is_dir() else 0o444))
    return image


# Inside fresh mount, PID and network namespaces, as root: the task's filesystem, then the start command
# as uid 10001, probed on loopback until it answers or exits.
TASK = r"""
set -eu
ip link set lo up
mount --make-rprivate /
mount --bind "$IMAGE/opt" /opt && mount --bind "$SITE" /opt/venv/site && mount -o remount,bind,ro /opt
mount --bind "$IMAGE/usr/local/bin" /usr/local/bin && mount -o remount,bind,ro /usr/local/bin
mount -t tmpfs -o mode=0755 tmpfs /run
mount --bind "$WORK" "$WORK"
install -d -o 10001 -g 10001 -m 0700 /run/floodgate
# The interpreter may live under a root-only home (pyenv): show uid 10001 that one folder only.
if [ -n "$PY_HOME_TOP" ]; then
  mkdir "$WORK/py" && mount --bind "$PY_HOME_TOP" "$WORK/py"
  mount -t tmpfs -o mode=0755 tmpfs "$(dirname "$PY_HOME_TOP")"
  mkdir "$PY_HOME_TOP" && mount --bind "$WORK/py" "$PY_HOME_TOP"
fi
mount -o remount,bind,ro /
if touch /probe-rw 2>/dev/null; then echo "root fs is writable" >&2; exit 3; fi
cd /opt/floodgate
setpriv --reuid=10001 --regid=10001 --clear-groups env -i \
  PATH=/opt/venv/bin:/usr/local/bin:/usr/bin:/bin HOME=/nonexistent PYTHONPATH=/opt/venv/src:/opt/venv/site \
  PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 FLOODGATE_CONFIG_TOML="$FLOODGATE_CONFIG_TOML" \
  FLOODGATE_WORKERS="$FLOODGATE_WORKERS" \
  REDIS_AUTH_TOKEN=tok3n FLOODGATE_KEYS_JSONL= AWS_REGION=us-east-1 AWS_DEFAULT_REGION=us-east-1 \
  AWS_ACCESS_KEY_ID=AKIAFAKE AWS_SECRET_ACCESS_KEY=fake AWS_EC2_METADATA_DISABLED=true \
  timeout 150 floodgate-start >"$WORK/edge.log" 2>&1 &
edge=$!
"$PYTHON" - "$edge" <<'PROBE'
import json, sys, time, urllib.error, urllib.request
from pathlib import Path
stat, seen = Path(f"/proc/{sys.argv[1]}/stat"), {}
# A worker serves on the shared port only once it has joined the fleet (edge/server.py): here, its
# Redis unreachable, once its membership falls back (stale_after_s, shortened by task_environment),
# a few seconds on an idle machine, far more on one the whole suite loads.
deadline = time.monotonic() + 120
while time.monotonic() < deadline and "healthz" not in seen:
    if not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] == "Z":
        seen["exited"] = True
        break
    try:
        seen["healthz"] = urllib.request.urlopen("http://127.0.0.1:8000/healthz", timeout=2).status
    except (OSError, urllib.error.URLError):
        time.sleep(0.2)
# Who serves (this PID namespace holds the task's processes only): `floodgate serve`.
for proc in Path("/proc").glob("[0-9]*/status"):
    status = dict(line.split(":", 1) for line in proc.read_text().splitlines() if ":" in line)
    cmdline = (proc.parent / "cmdline").read_bytes().split(b"\0")
    if b"edge.cli" in cmdline:
        seen["uid"] = int(status["Uid"].split()[0])
        seen["argv"] = [arg.decode() for arg in cmdline[cmdline.index(b"edge.cli") + 1 :] if arg]
print("probe " + json.dumps(seen))
PROBE
kill -TERM "$edge" 2>/dev/null || true
wait "$edge" || true
"""


def python_home_top() -> str:
    """The folder holding the interpreter inside a folder uid 10001 cannot enter (pyenv under a 0700
    /root: /root/.pyenv), or ''."""
    real = Path(os.path.realpath(sys.executable))
    for parent in reversed(real.parents):
        if not os.stat(parent).st_mode & 0o001:
            return str(parent / real.relative_to(parent).parts[0])
    return ""


def start_task(root: Path, image: Path, task: dict[str, str]) -> tuple[dict[str, object], str]:
    work = root / "work"
    work.mkdir()
    done = subprocess.run(
        ["unshare", "--mount", "--net", "--pid", "--fork", "--mount-proc", "bash", "-c", TASK],
        env={
            "PATH": os.environ["PATH"],
            "IMAGE": str(image),
            "WORK": str(work),
            "PYTHON": sys.executable,
            "SITE": sysconfig.get_paths()["purelib"],
            "PY_HOME_TOP": python_home_top(),
            **task,
        },
        capture_output=True,
        text=True,
        timeout=240,
    )
    log = (work / "edge.log").read_text() if (work / "edge.log").exists() else ""
    probe = [line for line in done.stdout.splitlines() if line.startswith("probe ")]
    assert done.returncode == 0 and probe, done.stdout + done.stderr + log
    return json.loads(probe[-1].removeprefix("probe ")), log


def test_the_documented_multi_model_image_serves_the_examples_models(
    task_environment: dict[str, str], root: Path
) -> None:
    models = tomllib.loads(task_environment["FLOODGATE_CONFIG_TOML"])["models"]
    assert len(models) >= 2, "terraform.tfvars.example's block names several models"
    context = build_context(root, list(models))
    image = lay_out_image(root, context, {"MODEL_DIR": MODELS_CONTEXT})

    probe, log = start_task(root, image, task_environment)

    assert probe == {
        "healthz": 200,
        "uid": UID,
        # One worker per vCPU of the task (edge_service), each a process of its own.
        "argv": [
            "serve",
            "--workers",
            task_environment["FLOODGATE_WORKERS"],
            "--config",
            "/run/floodgate/config.toml",
        ],
    }, log[-3000:]
    # Each model's tokenizer files are where its [models.NAME] path points, inside the image.
    for name, model in models.items():
        assert (image / model["path"].lstrip("/") / "tokenizer.json").is_file(), (name, model["path"])
