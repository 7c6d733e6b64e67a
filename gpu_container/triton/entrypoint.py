"""Container start-up: render the model repository, fetch the engine from S3, exec tritonserver.

Environment:
  ENGINE_S3_URI      s3://bucket/prefix/ of the built engine (required; empty skips the download
                     when the engine is already baked or mounted at ENGINE_DIR)
  ENGINE_DIR         local engine folder (default /engines/model)
  MODEL_REPOSITORY   where the repository is rendered (default /models)
  TRTLLM_<SETTING>   any TrtLlmSettings field upper-cased, e.g. TRTLLM_BATCH_SCHEDULER_POLICY,
                     TRTLLM_KV_CACHE_FREE_GPU_MEM_FRACTION (defaults in production/render.py)
Extra arguments are appended to the tritonserver command line.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import structlog

from gpu_container.triton.fetch_engine import fetch_engine
from gpu_container.triton.plain_logging import configure_plain_logging
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


def tritonserver_command(model_repository: Path, extra: list[str]) -> list[str]:
    return [
        "tritonserver",
        f"--model-repository={model_repository}",
        f"--grpc-port={GRPC_PORT}",
        f"--http-port={HTTP_PORT}",
        f"--metrics-port={METRICS_PORT}",
        "--allow-gpu-metrics=true",
        # Readiness drives the load balancer and the edge: not ready until the engine is loaded.
        "--strict-readiness=true",
        "--exit-on-error=true",
        *extra,
    ]


def main() -> None:
    configure_plain_logging()
    env = os.environ
    engine_dir = Path(env.get("ENGINE_DIR", "/engines/model"))
    repository = Path(env.get("MODEL_REPOSITORY", "/models"))
    uri = env.get("ENGINE_S3_URI", "")
    if uri:
        fetch_engine(uri, engine_dir)
    elif not any(engine_dir.glob("*.engine")):
        sys.exit(f"no ENGINE_S3_URI and no *.engine in {engine_dir}")
    render_repository(repository, settings_from_env(env, str(engine_dir)))
    command = tritonserver_command(repository, sys.argv[1:])
    log.info("exec tritonserver", command=" ".join(command))
    os.execvp(command[0], command)


if __name__ == "__main__":
    main()
