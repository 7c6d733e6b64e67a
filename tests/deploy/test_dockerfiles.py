"""The two Dockerfiles against how they are run: the `docker run` lines in their own headers, the
ECS task definition (USER, VOLUME, command), and the GPU hosts' user data. No Docker daemon runs
here (`docker info` cannot connect), so the images are parsed, not built."""

from __future__ import annotations

import json
import re
import shlex

from tests.deploy.documented import REPO, parse_dockerfile
from tests.deploy.test_documented_commands import check_docker_run
from tests.iac.hcl import EXAMPLE, MODULES, module

EDGE = parse_dockerfile(REPO / "Dockerfile.edge")
TRITON = parse_dockerfile(REPO / "gpu_container" / "triton" / "Dockerfile")


def header_runs(path: str) -> list[list[str]]:
    """`# docker run ...` lines of a Dockerfile's header comment."""
    lines = (REPO / path).read_text().splitlines()
    return [shlex.split(line.lstrip("# ").strip()) for line in lines if line.startswith("#   docker run")]


def task_container() -> dict[str, object]:
    definition = module(MODULES / "edge_service").resource("aws_ecs_task_definition", "edge")
    expression = definition["container_definitions"]
    assert expression.startswith("${jsonencode(")
    return {
        "readonly": '"readonlyRootFilesystem": true' in expression
        or "readonlyRootFilesystem = true" in expression,
        "command": re.search(r"command\s*[=:]\s*(\[[^\]]*\])", expression).group(1),  # type: ignore[union-attr]
        "mounts": re.findall(r'containerPath\s*[=:]\s*"([^"]+)"', expression),
    }


def test_each_header_docker_run_runs_in_its_image() -> None:
    runs = header_runs("Dockerfile.edge") + header_runs("gpu_container/triton/Dockerfile")

    assert len(runs) >= 3
    for words in runs:
        check_docker_run(words, " ".join(words))


def test_the_edge_images_documented_config_mount_is_the_file_it_serves() -> None:
    (run,) = header_runs("Dockerfile.edge")
    mount = run[run.index("-v") + 1].split(":")[1]
    command = json.loads(EDGE.all("CMD")[-1])

    assert command[command.index("--config") + 1] == mount


def test_the_edge_runs_as_its_user_and_writes_only_to_its_volume() -> None:
    (user,) = EDGE.all("USER")
    container = task_container()
    volumes = [json.loads(v)[0] if v.startswith("[") else v for v in EDGE.all("VOLUME")]

    assert user == "floodgate" and any("--uid 10001" in r for r in EDGE.all("RUN"))
    assert container["readonly"] is True
    assert container["mounts"] == ["/run/floodgate"]
    for path in container["mounts"]:
        assert path in volumes, f"{path}: a Fargate bind mount the image does not declare is root-owned"
        assert any(
            re.search(rf"install -d -o {user} -g {user} .*{re.escape(path)}", r) for r in EDGE.all("RUN")
        )
    # What the edge writes (settings, keys file) lies in that volume.
    settings = (EXAMPLE / "edge.toml.tftpl").read_text()
    assert re.search(r'keys_file = "/run/floodgate/', settings)


def test_the_task_command_is_installed_in_the_image() -> None:
    command = json.loads(str(task_container()["command"]))

    assert command == ["floodgate-start"]
    assert any(c.endswith(f"/usr/local/bin/{command[0]}") for c in EDGE.all("COPY"))


def test_the_triton_image_serves_by_default_and_runs_any_named_module() -> None:
    assert TRITON.all("ENTRYPOINT") == []
    assert json.loads(TRITON.all("CMD")[-1]) == ["python3", "-m", "gpu_container.triton.entrypoint"]
