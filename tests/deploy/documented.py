"""Reading the commands a deployment document and the GPU hosts' user data give, and the
Dockerfiles they run. No Docker daemon runs here (`docker info`: cannot connect), so the images are
not built: their Dockerfiles are parsed and checked against every `docker run` instead."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEPLOY_DOC = REPO / "docs" / "deploy.md"
USER_DATA = REPO / "iac" / "modules" / "gpu_pool" / "user_data.sh.tftpl"

# `docker run` options that take a value (the image is the first word after the options).
_RUN_VALUE_OPTIONS = {
    "-v", "--volume", "-e", "--env", "-p", "--publish", "--name", "--network", "--gpus", "--ipc",
    "--ulimit", "--log-driver", "--log-opt", "--restart", "-w", "--workdir", "-u", "--user",
    "--entrypoint",
}  # fmt: skip
# Which Dockerfile an image reference in the docs was built from.
IMAGES = {
    "$TRITON": REPO / "gpu_container" / "triton" / "Dockerfile",
    "floodgate-trtllm": REPO / "gpu_container" / "triton" / "Dockerfile",
    "${image}": REPO / "gpu_container" / "triton" / "Dockerfile",
    "$EDGE": REPO / "Dockerfile.edge",
    "floodgate-edge": REPO / "Dockerfile.edge",
}


@dataclass(frozen=True)
class Command:
    words: list[str]
    cwd: str  # relative to the repository root, as the document's `cd`s leave it
    source: str  # where it was found, for failure messages


@dataclass(frozen=True)
class Dockerfile:
    path: Path
    instructions: list[tuple[str, str]]

    def all(self, name: str) -> list[str]:
        return [args for instruction, args in self.instructions if instruction == name]

    def copied_sources(self) -> list[str]:
        return [src for args in self.all("COPY") if "--from" not in args for src in args.split()[:-1]]


def parse_dockerfile(path: Path) -> Dockerfile:
    text = re.sub(r"\\\n", " ", path.read_text())
    instructions = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            name, _, args = line.partition(" ")
            instructions.append((name.upper(), args.strip()))
    return Dockerfile(path, instructions)


def _substitute(line: str) -> str:
    # `$(...)` is a value whose command is checked on its own (see commands()); Terraform's
    # template placeholders are values too.
    line = re.sub(r"\$\(([^()]*)\)", "SUBST", line)
    return line


def _split(line: str) -> list[list[str]]:
    """One shell line -> its simple commands (split at &&, ||, |, ;), comments dropped."""
    words = shlex.split(_substitute(line), comments=True)
    commands: list[list[str]] = [[]]
    for word in words:
        if word in ("&&", "||", "|", ";"):
            commands.append([])
        else:
            commands[-1].append(word)
    return [c for c in commands if c]


def _logical_lines(block: str) -> list[str]:
    return [line for line in re.sub(r"\\\n\s*", " ", block).splitlines() if line.strip()]


def nested_commands(text: str) -> list[str]:
    """The commands inside `$(...)` (checked like any other)."""
    return re.findall(r"\$\(([^()]*)\)", text)


def doc_commands(path: Path = DEPLOY_DOC) -> list[Command]:
    """Every command of the document's sh blocks, and inline `python3 -m`/`floodgate` commands."""
    text = path.read_text()
    found: list[Command] = []
    for block in re.findall(r"```sh\n(.*?)```", text, re.DOTALL):
        cwd = "."
        for line in _logical_lines(block):
            for inner in nested_commands(line):
                found += [Command(c, cwd, line) for c in _split(inner)]
            for words in _split(line):
                if words[0] == "cd":
                    cwd = str(Path(cwd, words[1])) if not words[1].startswith("../") else "."
                found.append(Command(words, cwd, line))
    for inline in re.findall(r"`((?:python3 -m|floodgate) [^`]+)`", text):
        for inner in nested_commands(inline):
            found += [Command(c, ".", inline) for c in _split(inner)]
        found += [Command(c, ".", inline) for c in _split(inline)]
    return found


def user_data_commands(path: Path = USER_DATA) -> list[Command]:
    """The `docker run` commands of the GPU hosts' user data, placeholders kept as words."""
    found = []
    for line in _logical_lines(path.read_text()):
        if line.lstrip().startswith("docker run"):
            found += [Command(c, ".", line) for c in _split(line.replace('"$instance/', '"instance/'))]
    return found


def docker_run_parts(words: list[str]) -> tuple[list[str], str, list[str]]:
    """`docker run OPTIONS IMAGE COMMAND...` -> (options, image, command)."""
    assert words[:2] == ["docker", "run"], words
    i = 2
    while i < len(words) and words[i].startswith("-"):
        option = words[i]
        i += 2 if option in _RUN_VALUE_OPTIONS and "=" not in option else 1
    return words[2:i], words[i], words[i + 1 :]


def image_dockerfile(image: str) -> Path:
    for prefix, dockerfile in IMAGES.items():
        if image.startswith(prefix):
            return dockerfile
    raise AssertionError(f"no Dockerfile known for image {image!r}: add it to IMAGES")


def flags(words: list[str]) -> list[str]:
    return [w.split("=", 1)[0] for w in words if w.startswith("--")]
