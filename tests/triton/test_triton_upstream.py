"""TritonUpstream against a real tritonserver running our engine as a decoupled Python-backend model."""

from __future__ import annotations

import random
import socket
import uuid
from collections.abc import AsyncIterator, Callable, Iterator

import anyio
import httpx
import msgspec
import pytest

from edge.upstreams.base import Delta, GenerationRequest, RequestRejected, UpstreamError
from edge.upstreams.triton import (
    TritonUpstream,
    TrtLlmMetrics,
    end_token_ids,
    generate_body,
    stop_body,
)
from edge.upstreams.triton_sse import Event, event_tokens
from gpu_container.engine.async_engine import AsyncEngine
from gpu_container.engine.engine import LLMEngine
from tests.support.ports import free_port
from tests.triton.conftest import LocalTriton
from tests.triton.reading_task import cancel_after_first_token

PROMPT = [11, 42, 7, 300, 5, 91, 18, 260]
WAIT_S = 20.0


def _upstream(triton: LocalTriton, end_id: int | None = None) -> TritonUpstream:
    eos = end_token_ids(triton.model_dir)[0]
    return TritonUpstream(
        "triton-test",
        triton.process.http_url,
        triton.process.metrics_url,
        end_id=eos if end_id is None else end_id,
        pad_id=eos,
    )


@pytest.fixture
async def upstream(local_triton: LocalTriton) -> AsyncIterator[TritonUpstream]:
    up = _upstream(local_triton)
    yield up
    await up.aclose()


@pytest.fixture
async def fixed_length(local_triton: LocalTriton) -> AsyncIterator[TritonUpstream]:
    """end_id -1: the end token does not stop generation, so every request runs its full length."""
    up = _upstream(local_triton, end_id=-1)
    yield up
    await up.aclose()


@pytest.fixture(scope="module")
def in_process(local_triton: LocalTriton) -> Iterator[AsyncEngine]:
    engine = LLMEngine.from_pretrained(local_triton.model_dir, local_triton.engine_config)
    engine.start()
    yield AsyncEngine(engine, "in-process")
    engine.stop()


async def _collect(stream: AsyncIterator[Delta]) -> tuple[list[int], str | None]:
    tokens: list[int] = []
    reason = None
    async for delta in stream:
        assert reason is None, "a delta after the final one"
        tokens += delta.token_ids
        reason = delta.finish_reason
    return tokens, reason


async def _wait_for(
    upstream: TritonUpstream, condition: Callable[[TrtLlmMetrics], bool], what: str
) -> TrtLlmMetrics:
    """Poll the replica's metrics page until `condition` holds (bounded)."""
    last = await upstream.metrics()
    with anyio.move_on_after(WAIT_S):
        while not condition(last):
            await anyio.sleep(0.02)
            last = await upstream.metrics()
    assert condition(last), f"{what}: still {last}"
    return last


def _idle(m: TrtLlmMetrics) -> bool:
    return m.active_requests == 0 and m.free_blocks == m.max_blocks and m.used_blocks == 0


def _idle_since(before: TrtLlmMetrics) -> Callable[[TrtLlmMetrics], bool]:
    """Idle, on gauges refreshed after the engine ran at least one step past `before`; the gauges
    are refreshed periodically, so a page showing no new step may predate the request."""
    return lambda m: _idle(m) and m.iterations > before.iterations


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("temperature", "top_p", "seed", "penalties", "top_k"),
    [
        (0.0, 1.0, None, 0.0, 0),
        (0.9, 0.95, 1234, 0.0, 0),
        (0.2, 1.0, 7, 1.0, 0),
        (0.2, 1.0, None, -0.3, 1),
    ],
    ids=["greedy", "seeded-sampling", "penalties-at-a-low-temperature", "penalties-at-top-k-1"],
)
async def test_same_tokens_as_the_in_process_engine(
    upstream: TritonUpstream,
    in_process: AsyncEngine,
    temperature: float,
    top_p: float,
    seed: int | None,
    penalties: float,
    top_k: int,
) -> None:
    """The replica's model takes presence and frequency penalties after its temperature, as
    TensorRT-LLM's kernel does: the edge sends them so that they mean what they mean in-process."""
    same = {
        "max_new_tokens": 40,
        "temperature": temperature,
        "top_p": top_p,
        "seed": seed,
        "presence_penalty": penalties,
        "frequency_penalty": penalties,
        "top_k": top_k,
    }
    req = GenerationRequest("parity", PROMPT, **same)  # type: ignore[arg-type]
    local = GenerationRequest("parity-local", PROMPT, **same)  # type: ignore[arg-type]
    expected: list[int] = []
    expected_reason = None
    async for out in in_process.generate(local):
        expected += out.token_ids
        expected_reason = out.finish_reason
    tokens, reason = await _collect(upstream.generate(req))
    assert tokens == expected
    assert reason == expected_reason
    assert len(tokens) >= 1


@pytest.mark.anyio
async def test_unseeded_sampled_requests_each_sample_afresh(fixed_length: TritonUpstream) -> None:
    """TensorRT-LLM seeds a request that names no seed with 0, and the CPU model does as it does: the
    same prompt and settings gave the same reply every time. The edge sends a seed of its own with
    each, so a regenerated reply is a new sample, as OpenAI and vLLM give."""
    replies: set[tuple[int, ...]] = set()
    for i in range(3):
        req = GenerationRequest(f"unseeded-{i}", PROMPT, max_new_tokens=16, temperature=1.0)
        tokens, _ = await _collect(fixed_length.generate(req))
        assert len(tokens) == 16
        replies.add(tuple(tokens))
    assert len(replies) > 1


def _shared_prefix_prompts(block: int) -> tuple[list[int], list[int]]:
    """Two prompts sharing five full KV blocks, unique per run so no earlier request cached them."""
    rng = random.Random(uuid.uuid4().int)
    prefix = [rng.randrange(5, 250) for _ in range(5 * block)]
    return [*prefix, 11, 42, 7], [*prefix, 300, 5, 91, 18]


async def _cached_per_delta(stream: AsyncIterator[Delta]) -> list[int]:
    return [delta.cached_tokens async for delta in stream if delta.token_ids]


@pytest.mark.anyio
async def test_a_shared_prefix_is_reported_cached_as_the_in_process_engine_reports_it(
    upstream: TritonUpstream, in_process: AsyncEngine, local_triton: LocalTriton
) -> None:
    block = local_triton.engine_config.block_size
    first, second = _shared_prefix_prompts(block)
    via_triton, via_engine = [], []
    for i, prompt in enumerate((first, second)):
        req = GenerationRequest(f"prefix-{i}", prompt, max_new_tokens=6, temperature=0.0, ignore_eos=True)
        via_triton.append(await _cached_per_delta(upstream.generate(req)))
        local = GenerationRequest(
            f"prefix-local-{i}", prompt, max_new_tokens=6, temperature=0.0, ignore_eos=True
        )
        via_engine.append(await _cached_per_delta(in_process.generate(local)))
    # On the delta carrying the first token only (the two merge later tokens differently), in
    # whole blocks of the replica's block size.
    assert [d[0] for d in via_triton] == [d[0] for d in via_engine] == [0, 5 * block]
    assert all(set(d[1:]) <= {0} for d in via_triton)


def _events(text: str) -> list[Event]:
    return [
        msgspec.json.decode(line[6:], type=Event) for line in text.split("\n\n") if line.startswith("data: ")
    ]


async def _non_streaming_replies(
    triton: LocalTriton, req: GenerationRequest, *, reuse_stats: bool = False
) -> list[Event]:
    """The request as the tensorrt_llm contract's non-streaming form, over raw HTTP (no end token):
    every response, none carrying an error."""
    asks = {"streaming": [False], "return_kv_cache_reuse_stats": [reuse_stats]}
    body = generate_body(req, end_id=-1) | asks
    url = f"{triton.process.http_url}/v2/models/tensorrt_llm/generate_stream"
    async with httpx.AsyncClient(timeout=WAIT_S) as client:
        reply = await client.post(url, json=body)
    assert reply.status_code == 200, reply.text
    events = _events(reply.text)
    assert all(e.error is None for e in events)
    return events


@pytest.mark.anyio
async def test_kv_cache_reused_blocks_is_sent_only_when_asked(local_triton: LocalTriton) -> None:
    """TensorRT-LLM's contract: the output comes with every response of a request that sets
    return_kv_cache_reuse_stats (here non-streaming: its one response), and not otherwise."""
    block = local_triton.engine_config.block_size
    prompts = _shared_prefix_prompts(block)

    async def ask(i: int, prompt: list[int], reuse_stats: bool) -> list[int | None]:
        req = GenerationRequest(f"perf-{i}", prompt, max_new_tokens=4, temperature=0.0)
        replies = await _non_streaming_replies(local_triton, req, reuse_stats=reuse_stats)
        return [r.kv_cache_reused_blocks for r in replies if event_tokens(r)]

    assert await ask(0, prompts[0], reuse_stats=True) == [0]
    assert await ask(1, prompts[1], reuse_stats=False) == [None]
    assert await ask(2, prompts[1], reuse_stats=True) == [5]


@pytest.mark.anyio
async def test_fixed_length_request_ends_with_length(fixed_length: TritonUpstream) -> None:
    req = GenerationRequest("fixed", PROMPT, max_new_tokens=25, temperature=0.0)
    tokens, reason = await _collect(fixed_length.generate(req))
    assert len(tokens) == 25
    assert reason == "length"


@pytest.mark.anyio
async def test_stop_token_ends_the_stream_with_stop(
    upstream: TritonUpstream, in_process: AsyncEngine
) -> None:
    # The greedy continuation's 5th token, declared a stop token, must end the stream right there.
    probe = GenerationRequest("stop-probe", PROMPT, max_new_tokens=5, temperature=0.0, ignore_eos=True)
    greedy: list[int] = []
    async for out in in_process.generate(probe):
        greedy += out.token_ids
    stop = greedy[4]
    first = greedy.index(stop)
    req = GenerationRequest("stop", PROMPT, max_new_tokens=50, temperature=0.0, stop_ids=[stop])
    tokens, reason = await _collect(upstream.generate(req))
    assert tokens == greedy[: first + 1]
    assert reason == "stop"


@pytest.mark.anyio
async def test_closing_the_stream_stops_generation_and_frees_the_kv_cache(
    fixed_length: TritonUpstream,
) -> None:
    before = await _wait_for(fixed_length, _idle, "idle before the test")
    req = GenerationRequest("aclose", PROMPT, max_new_tokens=1500, temperature=0.0)
    stream = fixed_length.generate(req)
    received = 0
    async for delta in stream:
        received += len(delta.token_ids)
        if received >= 3:
            break
    await _wait_for(fixed_length, lambda m: m.active_requests == 1, "request running")
    await stream.aclose()  # type: ignore[attr-defined]
    after = await _wait_for(fixed_length, _idle_since(before), "after aclose")
    # Left running, the request would keep the engine busy for 1500 steps: idle before that means
    # it was dropped and its KV blocks freed (how much before depends on the machine's load: a
    # loaded one ran 643 steps of the tiny model before the stop landed).
    assert after.iterations - before.iterations < 1500


@pytest.mark.anyio
async def test_cancelling_the_reading_task_stops_generation(fixed_length: TritonUpstream) -> None:
    before = await _wait_for(fixed_length, _idle, "idle before the test")
    await cancel_after_first_token(fixed_length, "task-cancel", WAIT_S)
    after = await _wait_for(fixed_length, _idle_since(before), "after task cancellation")
    # Fewer than the request's 1500 steps: stopped, not run out (see the test above).
    assert after.iterations - before.iterations < 1500


@pytest.mark.anyio
async def test_a_stop_request_with_the_same_id_ends_generation(
    fixed_length: TritonUpstream, local_triton: LocalTriton
) -> None:
    """TensorRT-LLM's other way to cancel: a `stop=true` request carrying the running request's id."""
    before = await _wait_for(fixed_length, _idle, "idle before the test")
    stream = fixed_length.generate(GenerationRequest("to-stop", PROMPT, max_new_tokens=1500, temperature=0.0))
    first = await stream.__anext__()
    url = f"{local_triton.process.http_url}/v2/models/tensorrt_llm/generate_stream"
    async with httpx.AsyncClient(timeout=WAIT_S) as client:
        reply = await client.post(url, json=stop_body("to-stop"))
    assert reply.status_code == 200, reply.text
    assert all(e.error is None for e in _events(reply.text))
    with anyio.fail_after(WAIT_S):
        rest, reason = await _collect(stream)
    assert reason == "stop"
    assert len(first.token_ids) + len(rest) < 1500
    await _wait_for(fixed_length, _idle_since(before), "after the stop request")


@pytest.mark.anyio
async def test_a_stream_closed_without_a_stop_is_dropped_by_the_models_poll(
    fixed_length: TritonUpstream, local_triton: LocalTriton
) -> None:
    """An edge that vanishes sends no `stop`: the model's poll of closed streams still frees it."""
    before = await _wait_for(fixed_length, _idle, "idle before the test")
    body = generate_body(
        GenerationRequest("no-stop", PROMPT, max_new_tokens=1500, temperature=0.0), end_id=-1
    )
    url = f"{local_triton.process.http_url}/v2/models/tensorrt_llm/generate_stream"
    async with httpx.AsyncClient(timeout=WAIT_S) as client, client.stream("POST", url, json=body) as reply:
        with anyio.fail_after(WAIT_S):
            first = await reply.aiter_lines().__anext__()
        assert first.startswith("data: ") and '"error"' not in first
    # The connection is closed here, and no stop was sent.
    after = await _wait_for(fixed_length, _idle_since(before), "after the stream was cancelled")
    assert after.iterations - before.iterations < 1500


@pytest.mark.anyio
async def test_non_streaming_request_gets_every_token_in_one_final_response(
    local_triton: LocalTriton, in_process: AsyncEngine
) -> None:
    local = GenerationRequest("whole-local", PROMPT, max_new_tokens=12, temperature=0.0, ignore_eos=True)
    expected: list[int] = []
    async for out in in_process.generate(local):
        expected += out.token_ids
    whole = GenerationRequest("whole", PROMPT, max_new_tokens=12, temperature=0.0)
    replies = await _non_streaming_replies(local_triton, whole)
    with_tokens = [r for r in replies if event_tokens(r)]
    assert len(with_tokens) == 1
    assert event_tokens(with_tokens[0]) == expected


@pytest.mark.anyio
async def test_concurrent_streams_share_the_engine_batch(fixed_length: TritonUpstream) -> None:
    before = await _wait_for(fixed_length, _idle, "idle before the test")
    streams, tokens_each = 20, 32
    results: dict[int, tuple[list[int], str | None]] = {}

    async def one(i: int) -> None:
        # Ragged prompts: the dynamic batcher hands them to the model together all the same.
        prompt = [*PROMPT, *[i] * (i % 4)]
        req = GenerationRequest(f"batch-{i}", prompt, max_new_tokens=tokens_each, temperature=0.0)
        results[i] = await _collect(fixed_length.generate(req))

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            for i in range(streams):
                tg.start_soon(one, i)
    assert len(results) == streams
    assert all(len(t) == tokens_each and r == "length" for t, r in results.values())
    after = await _wait_for(fixed_length, _idle_since(before), "idle after the batch")
    # The model's own count of what it generated, exported beside TensorRT-LLM's gauges.
    assert after.generated_tokens - before.generated_tokens == streams * tokens_each
    steps = after.iterations - before.iterations
    # One after another, every step would carry one stream's token: as many steps as tokens. How
    # far below that it lands depends on how close together the streams arrive (a loaded machine
    # spreads them out), so only "some steps carried several streams" is a sound claim here; the
    # batch's size under load is measured in bench/.
    assert steps < streams * tokens_each, f"{steps} engine steps for {streams * tokens_each} tokens"


@pytest.mark.anyio
async def test_the_metrics_page_counts_a_finished_request_by_the_time_its_client_has_it(
    fixed_length: TritonUpstream,
) -> None:
    """Read once, no polling: a request shorter than the model's metrics period left the page
    showing the state from before it, and a reader's "idle before" snapshot then missed its tokens
    (CI saw the batch test above count one earlier request's 12 tokens as its own)."""
    before = await _wait_for(fixed_length, _idle, "idle before the test")
    for i in range(5):
        req = GenerationRequest(f"short-{i}", PROMPT, max_new_tokens=3, temperature=0.0)
        tokens, _ = await _collect(fixed_length.generate(req))
        page = await fixed_length.metrics()
        assert _idle(page)
        assert page.generated_tokens - before.generated_tokens == len(tokens) == 3
        before = page


@pytest.mark.anyio
async def test_capacity_and_readiness_come_from_the_replica(
    upstream: TritonUpstream, local_triton: LocalTriton
) -> None:
    assert await upstream.ready()
    cfg = local_triton.engine_config
    await _wait_for(upstream, _idle, "idle")
    capacity = await upstream.capacity()
    assert capacity.kv_tokens_total == cfg.num_blocks * cfg.block_size
    assert capacity.kv_tokens_used == 0
    assert capacity.max_sequences == cfg.max_num_seqs
    assert capacity.running == 0
    assert capacity.waiting == 0
    assert capacity.kv_block_tokens == cfg.block_size


@pytest.mark.anyio
async def test_a_refused_request_raises_request_rejected_naming_the_reason(upstream: TritonUpstream) -> None:
    """The engine's refusal of a request's own parameters is the request's fault (issue 13): the
    model answers INVALID_ARG, and the edge must not take it for a failed replica."""
    too_long = GenerationRequest("long", [5] * 5000, max_new_tokens=4, temperature=0.0)
    with pytest.raises(RequestRejected, match="prompt has 5000 tokens"):
        await _collect(upstream.generate(too_long))
    bad_token = GenerationRequest("bad", [10**6], max_new_tokens=4, temperature=0.0)
    with pytest.raises(RequestRejected, match="token ids outside"):
        await _collect(upstream.generate(bad_token))
    # The same replica serves the next request as before.
    tokens, reason = await _collect(upstream.generate(GenerationRequest("after", PROMPT, max_new_tokens=4)))
    assert tokens and reason is not None


@pytest.mark.anyio
async def test_a_live_replica_failing_a_request_raises_upstream_error(local_triton: LocalTriton) -> None:
    """An error that is not a refusal stays the replica's failure: here the server does not serve
    the model the edge asks for."""
    wrong = TritonUpstream(
        "wrong-model",
        local_triton.process.http_url,
        local_triton.process.metrics_url,
        model_name="no_such_model",
    )
    try:
        with pytest.raises(UpstreamError, match="no_such_model"):
            await _collect(wrong.generate(GenerationRequest("x", PROMPT, max_new_tokens=2)))
    finally:
        await wrong.aclose()


@pytest.mark.anyio
async def test_a_dead_replica_is_not_ready_and_fails_requests() -> None:
    port = free_port()
    dead = TritonUpstream("dead", f"http://127.0.0.1:{port}", f"http://127.0.0.1:{port}/metrics")
    try:
        assert not await dead.ready()
        with pytest.raises(UpstreamError):
            await _collect(dead.generate(GenerationRequest("x", PROMPT, max_new_tokens=2)))
        with pytest.raises(UpstreamError, match="metrics unavailable"):
            await dead.capacity()
    finally:
        await dead.aclose()


@pytest.mark.anyio
async def test_a_silent_replica_times_out_on_the_first_response() -> None:
    # A listener that accepts TCP and never answers: the stream never gets a first response.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        port = listener.getsockname()[1]
        silent = TritonUpstream(
            "silent",
            f"http://127.0.0.1:{port}",
            f"http://127.0.0.1:{port}/metrics",
            first_response_timeout_s=0.5,
        )
        try:
            with anyio.fail_after(WAIT_S), pytest.raises(UpstreamError, match="no response within"):
                await _collect(silent.generate(GenerationRequest("x", PROMPT, max_new_tokens=2)))
        finally:
            await silent.aclose()
