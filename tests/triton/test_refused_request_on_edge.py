"""A request the Triton replica refuses for its own parameters is a 400 for it alone (issue 13).

Regression: the CPU model's refusal reached the edge as a bare error string, the edge took it for a
failed replica (502 or an error event), marked the replica suspect and every user's time to first
token suffered. Here the replica's engine holds fewer tokens than the edge lets a prompt have, so
the engine itself refuses a long prompt, exactly as it refuses any bad parameter. Its repository
says no sequence limit (one rendered elsewhere): a replica that says it has the edge refuse such a
prompt itself (tests/triton/test_context_limit.py), and the engine's refusal is never reached.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from edge.upstreams.base import GenerationRequest, RequestRejected, UpstreamError
from edge.upstreams.triton import TritonUpstream, triton_upstreams
from gpu_container.engine.types import EngineConfig
from gpu_container.triton.cpu.repository import render_cpu_repository
from gpu_container.triton.launcher import TritonProcess, start_local_triton
from tests.edge.conftest import ROOMY_TIERS
from tests.edge.sse_client import CHAT, DONE, MODEL, events
from tests.support.live_server import LiveServer, demo_model_dir, start_server

# Fewer tokens than the edge allows a prompt (its own limit is the configured 2048).
SMALL_ENGINE = EngineConfig(block_size=16, num_blocks=64, max_num_seqs=8, max_model_len=48)
TOO_LONG = [{"role": "user", "content": "tell me a story " * 40}]


# Its whole length, by count: the tiny random-weight model's first token may be its end token, and a
# reply of it alone is empty (a full-suite run).
HELLO = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "ignore_eos": True}


def _suspects(server: LiveServer) -> list[str]:
    """Replicas the dispatcher blames for a failed generation (out of rotation until their next
    health check). Read directly: a health check that times out on a loaded machine also takes a
    replica out of rotation, and is not what this test is about."""
    members = server.app.state.runtime.pipeline.dispatcher.replicas.members
    return [replica.name for replica in members if replica.suspect_since_check is not None]


@pytest.fixture(scope="module")
def small_triton() -> Iterator[TritonProcess]:
    with tempfile.TemporaryDirectory(prefix="small-cpu-repo-") as repo:
        repository = render_cpu_repository(Path(repo), demo_model_dir(), SMALL_ENGINE)
        process = start_local_triton(_without_parameter(repository, "max_seq_len"))
        try:
            yield process
        finally:
            process.stop()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, small_triton: TritonProcess) -> Iterator[LiveServer]:
    spec = small_triton.replica_spec
    with start_server(
        tmp_path_factory.mktemp("edge-small-triton"), {"tiers": ROOMY_TIERS}, triton_upstreams(spec)
    ) as live:
        yield live


def test_a_request_the_replica_refuses_is_a_400_and_the_replica_stays_healthy(server: LiveServer) -> None:
    with httpx.Client(base_url=server.base_url, timeout=60.0, headers=server.auth("paid")) as client:
        plain = client.post(CHAT, json={"model": MODEL, "messages": TOO_LONG, "max_tokens": 4})
        with client.stream(
            "POST", CHAT, json={"model": MODEL, "messages": TOO_LONG, "max_tokens": 4, "stream": True}
        ) as stream:
            streamed = list(events(stream))
        suspects = _suspects(server)
    # Another user's good requests right after: served at once by the same replica.
    with httpx.Client(base_url=server.base_url, timeout=60.0, headers=server.auth("free")) as other:
        fine = other.post(CHAT, json=HELLO)
        streaming = {**HELLO, "stream": True, "stream_options": {"include_usage": True}}
        with other.stream("POST", CHAT, json=streaming) as stream:
            fine_streamed = list(events(stream))

    assert plain.status_code == 400, plain.text
    error = plain.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert "refused" in error["message"] and "max_model_len is 48" in error["message"]
    # A prompt past the replica's context: the code a client trims its history on, as for the
    # edge's own refusal of it (pipeline.py), and the parameter to trim.
    assert (error["code"], error["param"]) == ("context_length_exceeded", "messages")
    errors = [e["error"] for e in streamed if isinstance(e, dict) and "error" in e]
    assert len(errors) == 1 and errors[0]["type"] == "invalid_request_error"
    assert "max_model_len is 48" in errors[0]["message"]
    assert (errors[0]["code"], errors[0]["param"]) == ("context_length_exceeded", "messages")
    assert streamed[-1] == DONE
    assert suspects == []
    assert _suspects(server) == []
    assert fine.status_code == 200, fine.text
    assert fine.json()["usage"]["completion_tokens"] == 4
    chunks = [e for e in fine_streamed if isinstance(e, dict)]
    assert fine_streamed[-1] == DONE and not [e for e in chunks if "error" in e]
    assert chunks[-1]["usage"]["completion_tokens"] == 4


def _without_parameter(repository: Path, name: str) -> Path:
    """`repository` with the model's parameter `name` left out of its config.pbtxt."""
    path = repository / "tensorrt_llm" / "config.pbtxt"
    config = text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())
    del config.parameters[name]
    path.write_text(text_format.MessageToString(config))
    return repository


def _without_input(repository: Path, name: str) -> Path:
    """`repository` with the model's optional input `name` left out of its config.pbtxt: a replica
    whose contract differs from the edge's (TensorRT-LLM 0.19 renamed return_kv_cache_reuse_stats
    return_perf_metrics), so Triton's own input checks answer every request of the edge's a 400."""
    path = repository / "tensorrt_llm" / "config.pbtxt"
    config = text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())
    kept = [tensor for tensor in config.input if tensor.name != name]
    assert len(kept) == len(config.input) - 1
    del config.input[:]
    config.input.extend(kept)
    path.write_text(text_format.MessageToString(config))
    return repository


@contextmanager
def _triton_without(name: str) -> Iterator[TritonProcess]:
    """A tritonserver over the small CPU repository whose model does not declare input `name`."""
    with tempfile.TemporaryDirectory(prefix="cpu-repo-without-") as repo:
        rendered = render_cpu_repository(Path(repo), demo_model_dir(), SMALL_ENGINE)
        process = start_local_triton(_without_input(rendered, name))
        try:
            yield process
        finally:
            process.stop()


@pytest.fixture(scope="module")
def mismatched_triton() -> Iterator[TritonProcess]:
    with _triton_without("return_kv_cache_reuse_stats") as process:
        yield process


def test_a_replica_whose_contract_differs_is_the_replicas_failure_not_the_users(
    tmp_path: Path, mismatched_triton: TritonProcess
) -> None:
    """Triton's 400 for an input the edge sends and the replica's model lacks names nothing of the
    user's: the replica failed (a 502 with Retry-After, never a 400 blaming the request), and it
    is suspect."""
    spec = mismatched_triton.replica_spec
    with (
        start_server(tmp_path, {"tiers": ROOMY_TIERS}, triton_upstreams(spec)) as live,
        httpx.Client(base_url=live.base_url, timeout=60.0, headers=live.auth("paid")) as client,
    ):
        plain = client.post(CHAT, json=HELLO)
        suspects = _suspects(live)
    assert plain.status_code >= 500, plain.text
    assert "retry-after" in plain.headers
    assert plain.json()["error"]["type"] != "invalid_request_error"
    assert suspects == [f"triton-{spec.rsplit(':', 1)[0]}"]


def test_a_replica_whose_contract_differs_fails_over_to_a_healthy_one(
    tmp_path: Path, mismatched_triton: TritonProcess, small_triton: TritonProcess
) -> None:
    """Each request the mismatched replica takes goes on, before any token, to the healthy one."""
    spec = f"{mismatched_triton.replica_spec},{small_triton.replica_spec}"
    with (
        start_server(tmp_path, {"tiers": ROOMY_TIERS}, triton_upstreams(spec)) as live,
        httpx.Client(base_url=live.base_url, timeout=60.0, headers=live.auth("paid")) as client,
    ):
        answers = [client.post(CHAT, json=HELLO) for _ in range(4)]
        streamed = []
        for _ in range(2):
            with client.stream("POST", CHAT, json={**HELLO, "stream": True}) as stream:
                streamed.append(list(events(stream)))
    assert [answer.status_code for answer in answers] == [200] * 4, [a.text for a in answers]
    for reply in streamed:
        assert reply[-1] == DONE and not [e for e in reply if isinstance(e, dict) and "error" in e]


@pytest.fixture(scope="module")
def not_decoupled_triton() -> Iterator[TritonProcess]:
    """A replica whose model is not deployed decoupled, as tensorrtllm_backend's config.pbtxt comes
    out of its fill_template with decoupled_mode:False: TensorRT-LLM (and our CPU model after it)
    refuses every streaming request, and the edge streams every request."""
    with tempfile.TemporaryDirectory(prefix="cpu-repo-not-decoupled-") as repo:
        rendered = render_cpu_repository(Path(repo), demo_model_dir(), SMALL_ENGINE)
        path = rendered / "tensorrt_llm" / "config.pbtxt"
        config = text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())
        config.model_transaction_policy.decoupled = False
        path.write_text(text_format.MessageToString(config))
        process = start_local_triton(rendered)
        try:
            yield process
        finally:
            process.stop()


def test_a_replica_not_deployed_decoupled_is_the_replicas_failure_not_the_users(
    tmp_path: Path, not_decoupled_triton: TritonProcess, small_triton: TritonProcess
) -> None:
    """TensorRT-LLM's "Streaming is only supported if model is deployed using decoupled mode" names
    nothing of the user's (the edge sends streaming for every request): the replica failed, is
    suspect, and the request goes on to a healthy replica rather than being answered 400."""
    spec = not_decoupled_triton.replica_spec
    with (
        start_server(tmp_path, {"tiers": ROOMY_TIERS}, triton_upstreams(spec)) as live,
        httpx.Client(base_url=live.base_url, timeout=60.0, headers=live.auth("paid")) as client,
    ):
        plain = client.post(CHAT, json=HELLO)
        suspects = _suspects(live)
    assert plain.status_code >= 500, plain.text
    assert plain.json()["error"]["type"] != "invalid_request_error"
    assert suspects == [f"triton-{spec.rsplit(':', 1)[0]}"]

    both = f"{not_decoupled_triton.replica_spec},{small_triton.replica_spec}"
    with (
        start_server(tmp_path / "both", {"tiers": ROOMY_TIERS}, triton_upstreams(both)) as live,
        httpx.Client(base_url=live.base_url, timeout=60.0, headers=live.auth("paid")) as client,
    ):
        answers = [client.post(CHAT, json=HELLO) for _ in range(4)]
    assert [answer.status_code for answer in answers] == [200] * 4, [a.text for a in answers]


@pytest.fixture(scope="module")
def no_stop_words_triton() -> Iterator[TritonProcess]:
    """A replica whose model does not declare stop_words_list, which carries the model's own end
    tokens on every request that does not ignore them, whatever the user asked for."""
    with _triton_without("stop_words_list") as process:
        yield process


@pytest.mark.anyio
async def test_a_replica_lacking_the_input_for_the_models_own_end_tokens_is_the_replicas_failure(
    no_stop_words_triton: TritonProcess,
) -> None:
    """A checkpoint with one end token: the pipeline puts it among every request's stop ids, so
    stop_words_list goes with every request that does not ignore it, whatever the user asked for.
    A replica refusing it refuses everyone's: its failure, not the request's. A stop token of the
    request's own is still the request's refusal."""
    upstream = TritonUpstream(
        "triton-no-stop-words",
        no_stop_words_triton.http_url,
        no_stop_words_triton.metrics_url,
        end_id=2,
        pad_id=2,
    )
    try:
        with pytest.raises(UpstreamError, match="stop_words_list"):
            async for _ in upstream.generate(GenerationRequest("own-end", [11, 42, 7], 4, stop_ids=[2])):
                pass
        with pytest.raises(RequestRejected, match="does not take stop_words_list"):
            async for _ in upstream.generate(GenerationRequest("asked", [11, 42, 7], 4, stop_ids=[2, 9])):
                pass
    finally:
        await upstream.aclose()


@pytest.fixture(scope="module")
def no_presence_triton() -> Iterator[TritonProcess]:
    """A replica whose model does not declare presence_penalty, an input the edge sends only for a
    request that sets one (edge/upstreams/triton.py's generate_body: "a model repository that does
    not declare them still takes the rest")."""
    with _triton_without("presence_penalty") as process:
        yield process


def test_an_optional_parameter_the_replicas_model_lacks_is_the_requests_refusal(
    tmp_path: Path, no_presence_triton: TritonProcess
) -> None:
    """A request setting a parameter the deployed model does not take is refused (400) for that
    request alone: the input is sent only because the user asked for it, so the replica is not
    failed for it. Were it, one user resending it would keep every replica out of rotation, and
    the user would be told to retry (502, Retry-After) a request that can never be served."""
    spec = no_presence_triton.replica_spec
    with (
        start_server(tmp_path, {"tiers": ROOMY_TIERS}, triton_upstreams(spec)) as live,
        httpx.Client(base_url=live.base_url, timeout=60.0, headers=live.auth("paid")) as client,
    ):
        penalised = client.post(CHAT, json={**HELLO, "presence_penalty": 0.5})
        suspects = _suspects(live)
        plain = client.post(CHAT, json=HELLO)
    assert penalised.status_code == 400, penalised.text
    assert penalised.json()["error"]["type"] == "invalid_request_error"
    assert "presence_penalty" in penalised.json()["error"]["message"]
    assert suspects == []
    assert plain.status_code == 200, plain.text
