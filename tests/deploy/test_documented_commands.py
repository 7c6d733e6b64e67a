"""Every command docs/deploy.md gives (and every `docker run` of the GPU hosts' user data) names a
real entrypoint, file, flag, Terraform target and output, and runs against an image whose
Dockerfile lets it: the review that found the engine build passing its words to the serving
ENTRYPOINT would have been this test. Python entrypoints are run for real (`--help`), so a flag
the document uses must be one the program accepts."""

from __future__ import annotations

import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

from tests.deploy.documented import (
    REPO,
    Command,
    doc_commands,
    docker_run_parts,
    flags,
    image_dockerfile,
    parse_dockerfile,
    user_data_commands,
)
from tests.iac.hcl import EXAMPLE, MODULES, module, only

COMMANDS = doc_commands()
FLOODGATE = Path(sys.executable).parent / "floodgate"
ELSEWHERE = {"aws", "printf"}  # the AWS CLI and the shell: not ours to check


@cache
def help_text(argv: tuple[str, ...]) -> str:
    done = subprocess.run([*argv, "--help"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{' '.join(argv)} --help failed: {done.stderr[-2000:]}"
    return done.stdout


def check_python(words: list[str], where: str) -> str:
    assert words[:2] in (["python3", "-m"], ["python", "-m"]), where
    module_name = words[2]
    source = REPO / (module_name.replace(".", "/") + ".py")
    assert source.is_file(), f"{where}: no module {module_name}"
    usage = help_text((sys.executable, "-m", module_name))
    for flag in flags(words[3:]):
        assert flag in usage, f"{where}: {module_name} has no {flag}"
    return str(source.relative_to(REPO))


def check_floodgate(words: list[str], where: str) -> None:
    subcommands = []
    for word in words[1:]:
        if word.startswith("-"):
            break
        subcommands.append(word)
    # `keys create|list|revoke` in prose names several subcommands: each must exist.
    *parents, last = subcommands[:2]
    for alternative in last.split("|"):
        usage = help_text((str(FLOODGATE), *parents, alternative))
        for flag in flags(words[1:]):
            assert flag in usage, f"{where}: floodgate {' '.join([*parents, alternative])} has no {flag}"


def deployed_platform(dockerfile: Path) -> str:
    """The platform the Terraform runs an image on: the edge's task definition's runtime platform,
    the GPU hosts' AMI (its SSM parameter names the architecture)."""
    if dockerfile == REPO / "Dockerfile.edge":
        task = module(MODULES / "edge_service").resource("aws_ecs_task_definition", "edge")
        platform = only(task["runtime_platform"])
        assert platform["operating_system_family"] == "LINUX"
        return {"X86_64": "linux/amd64", "ARM64": "linux/arm64"}[platform["cpu_architecture"]]
    assert dockerfile == image_dockerfile("$TRITON"), dockerfile
    ami = module(MODULES / "gpu_pool").variables()["ami_ssm_parameter"]["default"]
    (architecture,) = {"x86_64", "arm64"} & set(ami.split("/"))
    return {"x86_64": "linux/amd64", "arm64": "linux/arm64"}[architecture]


def check_docker(words: list[str], where: str) -> None:
    if words[1] == "build":
        dockerfile = REPO / words[words.index("-f") + 1]
        assert dockerfile.is_file(), where
        # Built anywhere (an ARM laptop too), the image must be for the machines that run it.
        platform = next((w.split("=", 1)[1] for w in words if w.startswith("--platform=")), None)
        if "--platform" in words:
            platform = words[words.index("--platform") + 1]
        assert platform == deployed_platform(dockerfile), (
            f"{where}: needs --platform {deployed_platform(dockerfile)}"
        )
        declared = {a.split("=", 1)[0] for a in parse_dockerfile(dockerfile).all("ARG")}
        for i, word in enumerate(words):
            if word == "--build-arg":
                assert words[i + 1].split("=", 1)[0] in declared, f"{where}: {dockerfile.name} has no ARG"
        assert words[-1] == ".", f"{where}: the build context is the repository root"
    elif words[1] == "run":
        check_docker_run(words, where)
    else:
        assert words[1] in ("login", "push"), where


def check_docker_run(words: list[str], where: str) -> None:
    _, image, command = docker_run_parts(words)
    dockerfile = parse_dockerfile(image_dockerfile(image))
    if not command:
        assert dockerfile.all("CMD") or dockerfile.all("ENTRYPOINT"), f"{where}: the image has nothing to run"
        return
    # A command after the image replaces CMD; with an ENTRYPOINT it would become its arguments.
    assert not dockerfile.all("ENTRYPOINT"), f"{where}: {dockerfile.path.name} has an ENTRYPOINT"
    if command[:2] == ["python3", "-m"]:
        source = check_python(command, where)
        copied = " ".join(dockerfile.copied_sources())
        assert source in copied or str(Path(source).parent) + "/" in copied, (
            f"{where}: {source} not in the image"
        )


def check_terraform(command: Command) -> None:
    words = [w for w in command.words[1:] if not w.startswith("-chdir=")]
    names = module(EXAMPLE)
    if words[0] == "apply":
        for word in words[1:]:
            if word.startswith("-target="):
                parts = word.removeprefix("-target=").split(".")
                assert parts[0] == "module" and parts[1] in names.calls(), f"{command.source}: {word}"
                if len(parts) > 2:
                    target = module((EXAMPLE / names.calls()[parts[1]]["source"]).resolve())
                    assert parts[3] in target.resources(parts[2]), f"{command.source}: {word}"
    elif words[0] == "output":
        assert words[-1] in names.outputs(), f"{command.source}: no output {words[-1]}"
    else:
        assert words[0] in ("init", "destroy"), command.source


def check(command: Command) -> None:
    words, where = command.words, command.source
    head = words[0]
    if "=" in head:  # VAR=value
        return
    if head in ("python3", "python"):
        check_python(words, where)
    elif head == "floodgate":
        check_floodgate(words, where)
    elif head == "docker":
        check_docker(words, where)
    elif head == "terraform":
        check_terraform(command)
    elif head == "cd":
        assert (REPO / command.cwd).is_dir() or words[1].startswith("../"), where
    elif head == "cp":
        assert (REPO / command.cwd / words[1]).is_file(), f"{where}: no {words[1]} in {command.cwd}"
    else:
        assert head in ELSEWHERE, f"{where}: no check knows {head!r}: teach this test"


def test_the_document_has_commands_to_walk() -> None:
    heads = {c.words[0] for c in COMMANDS}

    assert {"python3", "docker", "terraform", "floodgate"} <= heads


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c.words)[:80])
def test_each_documented_command_names_real_things(command: Command) -> None:
    check(command)


@pytest.mark.parametrize("command", user_data_commands(), ids=lambda c: " ".join(c.words)[:80])
def test_each_docker_run_of_the_gpu_hosts_runs_in_its_image(command: Command) -> None:
    check_docker_run(command.words, command.source)


def test_the_old_entrypoint_would_have_swallowed_the_engine_build(tmp_path: Path) -> None:
    # The check above on the Dockerfile as it was (ENTRYPOINT of the serving entrypoint).
    old = subprocess.run(
        ["git", "show", "bba6fa2~1:gpu_container/triton/Dockerfile"], cwd=REPO, capture_output=True, text=True
    )
    if old.returncode != 0:
        pytest.skip("NOT RUN: the old Dockerfile is not in this checkout's history")
    path = tmp_path / "old-triton.Dockerfile"
    path.write_text(old.stdout)

    assert parse_dockerfile(path).all("ENTRYPOINT")
    assert not parse_dockerfile(image_dockerfile("$TRITON")).all("ENTRYPOINT")
