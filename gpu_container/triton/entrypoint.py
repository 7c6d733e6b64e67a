"""Container start-up: render the model repository, fetch the engine from S3, exec tritonserver.

Environment:
  ENGINE_S3_URI      s3://bucket/prefix/ of the built engine (required; empty skips the download
                     when the engine is already baked or mounted at ENGINE_DIR)
  ENGINE_DIR         local engine folder (default /engines/model)
  MODEL_REPOSITORY   where the repository is rendered (default /models)
  TRTLLM_<SETTING>   any TrtLlmSettings field upper-cased, e.g. TRTLLM_BATCH_SCHEDULER_POLICY,
                     TRTLLM_KV_CACHE_FREE_GPU_MEM_FRACTION (defaults in production/render.py)
Extra arguments are appended to the tritonserver command line.

An engine built for several GPUs (`build_engine --tp-size N`: its config.json says world_size N)
runs as N tritonserver processes under one `mpirun`, one per GPU, as TensorRT-LLM's backend
requires (its launch_triton_server.py does the same): rank 0 serves, the other ranks only load the
TensorRT-LLM model and take part in it. The host must have N GPUs (`--gpus all`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import structlog

from gpu_container.plain_logging import configure_plain_logging
from gpu_container.triton.fetch_engine import fetch_engine
from gpu_container.triton.model_name import MODEL_NAME
from gpu_container.triton.production.render import TrtLlmSettings, render_repository

log = structlog.get_logger(__name__)

GRPC_PORT = 8001
HTTP_PORT = 8000
METRICS_PORT = 8002


def settings_from_env(env: Mapping[str, str], engine_dir: str) -> TrtLlmSettings:
    overrides: dict[str, Any] = {"engine_dir": engine_dir}
    defaults = TrtLlmSettings()
    for f in dataclasses.fields(TrtLlmSettings):
        raw = env.get(f"TRTLLM_{f.name.upper()}")
        if raw is None or f.name == "engine_dir":
            continue
        default = getattr(defaults, f.name)
        if isinstance(default, bool):
            overrides[f.name] = raw.strip().lower() in ("1", "true", "yes")
        else:
            overrides[f.name] = type(default)(raw)
    return dataclasses.replace(defaults, **overrides)


def engine_world_size(engine_dir: Path) -> int:
    """GPUs the engine was built for: `pretrained_config.mapping.world_size` of its config.json
    (TensorRT-LLM 0.16's engine layout); 1 when the engine says nothing."""
    try:
        config = json.loads((engine_dir / "config.json").read_text())
    except FileNotFoundError:
        return 1
    mapping = config.get("pretrained_config", {}).get("mapping", {})
    world_size = int(mapping.get("world_size", 1))
    if world_size < 1:
        raise ValueError(f"{engine_dir / 'config.json'}: world_size {world_size}")
    return world_size


def _server_args(model_repository: Path) -> list[str]:
    return [
        f"--model-repository={model_repository}",
        f"--grpc-port={GRPC_PORT}",
        f"--http-port={HTTP_PORT}",
        f"--metrics-port={METRICS_PORT}",
        "--allow-gpu-metrics=true",
        # Readiness drives the load balancer and the edge: not ready until the engine is loaded.
        "--strict-readiness=true",
        "--exit-on-error=true",
    ]


def tritonserver_command(model_repository: Path, extra: list[str], world_size: int = 1) -> list[str]:
    if world_size == 1:
        return ["tritonserver", *_server_args(model_repository), *extra]
    command = ["mpirun", "--allow-run-as-root"]
    for rank in range(world_size):
        command += ["-n", "1", "tritonserver", *_server_args(model_repository)]
        # Each rank's Python backend needs its own shared-memory region names.
        command += [f"--backend-config=python,shm-region-prefix-name=prefix{rank}_"]
        if rank == 0:
            command += extra
        else:
            command += ["--model-control-mode=explicit", f"--load-model={MODEL_NAME}"]
        command.append(":")
    return command[:-1]


def _stop_before_serving(signum: int, _frame: object) -> None:
    """A stop (`docker stop`: SIGTERM) while the engine downloads. The container's first process
    is this one, and a PID namespace's first process receives only the signals it handles: without
    this, the stop was ignored until Docker's stop timeout killed the container, mid-write, and the
    partial engine file stayed on the host's volume. Raised in the main thread, the exit unwinds the
    download (boto3 cancels its transfer and deletes its temporary file). Once tritonserver is
    exec'd, the signal is its own (exec resets a handled signal to its default). A stop asked for
    is no failure: exit 0, as tritonserver's own clean stop."""
    log.warning("stopped_before_tritonserver_started", signal=signal.Signals(signum).name)
    raise SystemExit(0)


def main() -> None:
    configure_plain_logging()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, _stop_before_serving)
    env = os.environ
    engine_dir = Path(env.get("ENGINE_DIR", "/engines/model"))
    repository = Path(env.get("MODEL_REPOSITORY", "/models"))
    uri = env.get("ENGINE_S3_URI", "")
    if uri:
        fetch_engine(uri, engine_dir)
    elif not any(engine_dir.glob("*.engine")):
        sys.exit(f"no ENGINE_S3_URI and no *.engine in {engine_dir}")
    render_repository(repository, settings_from_env(env, str(engine_dir)))
    command = tritonserver_command(repository, sys.argv[1:], engine_world_size(engine_dir))
    log.info("exec tritonserver", command=" ".join(command))
    os.execvp(command[0], command)


if __name__ == "__main__":
    main()
