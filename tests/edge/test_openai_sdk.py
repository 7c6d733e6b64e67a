"""The official openai SDK against a real edge, on either upstream path: the compatibility clients
actually rely on."""

from __future__ import annotations

import inspect
import json
import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest

from edge.text.model_text import ModelText
from edge.upstreams.base import Delta, GenerationRequest, Upstream
from edge.upstreams.triton import generate_body
from gpu_container.engine.front import sampling_params
from gpu_container.engine.sampler import sample
from tests.edge.conftest import BOTH_PATHS, ROOMY_TIERS
from tests.edge.sse_client import LONG_PROMPT, MODEL
from tests.support.live_server import LiveServer, demo_model_dir, start_server
from tests.support.scripted_replicas import scripted_replicas

UPSTREAMS = BOTH_PATHS


@pytest.fixture
def sdk(server: LiveServer) -> Iterator[openai.OpenAI]:
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key=server.keys["paid"], max_retries=0)
    yield client
    client.close()


def _prompt_tokens(server: LiveServer) -> int:
    return len(ModelText.load(Path(server.settings.model.demo_dir)).encode_chat(LONG_PROMPT))


def test_sdk_stream_with_usage(server: LiveServer, sdk: openai.OpenAI) -> None:
    stream = sdk.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "hi"}],
        stream=True,
        max_tokens=16,
        seed=3,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    ids = {c.id for c in chunks}
    assert len(ids) == 1 and next(iter(ids)).startswith("chatcmpl-")
    assert chunks[0].choices[0].delta.role == "assistant"
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1 and finals[0].choices[0].finish_reason in ("stop", "length")
    usage = chunks[-1].usage
    assert usage is not None and chunks[-1].choices == []
    assert usage.prompt_tokens == _prompt_tokens(server)
    assert 1 <= usage.completion_tokens <= 16
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


def test_sdk_non_stream(server: LiveServer, sdk: openai.OpenAI) -> None:
    completion = sdk.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=8, temperature=0
    )
    assert completion.object == "chat.completion"
    assert completion.choices[0].message.role == "assistant"
    assert completion.usage is not None
    assert completion.usage.prompt_tokens == _prompt_tokens(server)
    assert completion.usage.completion_tokens <= 8


def test_sdk_raises_typed_errors(server: LiveServer) -> None:
    bad_key = openai.OpenAI(base_url=server.base_url + "/v1", api_key="fg-nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad_key.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    good = openai.OpenAI(base_url=server.base_url + "/v1", api_key=server.keys["paid"], max_retries=0)
    with pytest.raises(openai.BadRequestError) as info:
        good.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=99_999
        )
    assert info.value.param == "max_tokens"
    assert good.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError):
        good.models.retrieve("no-such-model")


def test_sdk_hears_an_endpoint_the_edge_lacks_named(sdk: openai.OpenAI) -> None:
    """As OpenAI answers an unknown URL: the method and path, not a bare "Not Found" that leaves a
    user of the legacy completions API guessing what was wrong."""
    with pytest.raises(openai.NotFoundError) as info:
        sdk.completions.create(model=MODEL, prompt="hi", max_tokens=4)
    assert isinstance(info.value.body, dict)
    assert info.value.body["message"] == "Invalid URL (POST /v1/completions)"


def _not_found(call: Any) -> dict[str, Any]:
    with pytest.raises(openai.NotFoundError) as info:
        call()
    assert isinstance(info.value.body, dict)
    return info.value.body


def test_sdk_hears_every_404_typed_as_openai_types_it(sdk: openai.OpenAI) -> None:
    """OpenAI answers an unknown model, URL or object 404 with type invalid_request_error; these
    said not_found_error, a type OpenAI never sends, which a client branching on the type (as on
    invalid_request_error for a request to fix) did not recognise. The codes stay as they were."""
    messages: list[Any] = [{"role": "user", "content": "hi"}]
    chat = _not_found(lambda: sdk.chat.completions.create(model="no-such-model", messages=messages))
    assert chat == {
        "message": "The model `no-such-model` does not exist or you do not have access to it.",
        "type": "invalid_request_error",
        "param": "model",
        "code": "model_not_found",
    }
    assert _not_found(lambda: sdk.models.retrieve("no-such-model")) == chat
    url = _not_found(lambda: sdk.completions.create(model=MODEL, prompt="hi", max_tokens=4))
    assert (url["type"], url["code"]) == ("invalid_request_error", None)
    cancel = _not_found(lambda: sdk.post("/chat/completions/req-nope/cancel", cast_to=object))
    assert (cancel["type"], cancel["code"]) == ("invalid_request_error", "request_not_found")
    history = _not_found(lambda: sdk.get("/conversations/conv-nope/messages", cast_to=object))
    assert (history["type"], history["code"]) == ("invalid_request_error", "not_found")


@pytest.mark.parametrize("tier", ["auto", "flex"])
def test_sdk_hears_the_service_tier_that_served_a_request_that_named_one(
    sdk: openai.OpenAI, tier: Any
) -> None:
    """OpenAI says the tier that served a request that named one, in the answer and every chunk; a
    client asking for flex or priority (for its price) read None and could not tell what it got.
    Every request here is served as "default"; one that names none is answered without it."""
    messages: list[Any] = [{"role": "user", "content": "hi"}]
    done = sdk.chat.completions.create(model=MODEL, messages=messages, max_tokens=2, service_tier=tier)
    assert done.service_tier == "default"
    chunks = list(
        sdk.chat.completions.create(
            model=MODEL,
            messages=messages,
            max_tokens=4,
            service_tier=tier,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    # The first chunk, the usage chunk after the last, and whatever came between: how many came
    # between depends on the reply (an end token may come first) and on how many tokens the edge
    # sent in one chunk (a suite run's Triton path had 3 chunks in all, where this asked for more).
    assert chunks[0].choices and chunks[-1].usage is not None
    assert {c.service_tier for c in chunks} == {"default"}
    plain = sdk.chat.completions.create(model=MODEL, messages=messages, max_tokens=2)
    assert plain.service_tier is None and "service_tier" not in plain.model_dump(exclude_unset=True)


def test_sdk_hears_json_mode_and_tools_refused_by_name(sdk: openai.OpenAI) -> None:
    messages: list[Any] = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.BadRequestError) as info:
        sdk.chat.completions.create(model=MODEL, messages=messages, response_format={"type": "json_object"})
    assert (info.value.param, info.value.code) == ("response_format", "unsupported_value")
    tool: Any = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    with pytest.raises(openai.BadRequestError) as info:
        sdk.chat.completions.create(model=MODEL, messages=messages, tools=[tool])
    assert (info.value.param, info.value.code) == ("tools", "unsupported_parameter")
    reply = sdk.chat.completions.create(
        model=MODEL, messages=messages, tools=[tool], tool_choice="none", max_tokens=2
    )
    assert reply.choices[0].message.tool_calls is None


SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
STRUCTURED_OUTPUTS: dict[str, Any] = {
    "guided_json": SCHEMA,
    "guided_choice": ["yes", "no"],
    "guided_regex": "[0-9]{3}",
    "guided_grammar": 'root ::= "yes" | "no"',
    "guided_decoding_backend": "xgrammar",
    "guided_whitespace_pattern": " ?",
    "structured_outputs": {"json": SCHEMA},
    "structural_tag": json.dumps(
        {"structures": [{"begin": "<f>", "schema": SCHEMA, "end": "</f>"}], "triggers": ["<f>"]}
    ),
}


@pytest.mark.parametrize("field", sorted(STRUCTURED_OUTPUTS))
def test_sdk_hears_vllms_structured_outputs_refused_by_name(sdk: openai.OpenAI, field: str) -> None:
    """vLLM holds the reply to these; a reply in free prose would fail the client's parse later and
    further away, so they are refused as response_format's JSON is. structural_tag (JSON between the
    tags the reply opens) was answered 200 in free prose, as if it had not been sent."""
    messages: list[Any] = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.BadRequestError) as info:
        sdk.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=2, extra_body={field: STRUCTURED_OUTPUTS[field]}
        )
    assert (info.value.param, info.value.code) == (field, "unsupported_parameter")
    # Sent as null, as clients that fill every field send it: nothing is asked.
    reply = sdk.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=2, extra_body={field: None}
    )
    assert reply.choices[0].finish_reason in ("stop", "length")


@pytest.mark.parametrize(
    ("field", "value", "code"),
    [
        ("modalities", ["text", "audio"], "unsupported_value"),
        ("audio", {"voice": "alloy", "format": "wav"}, "unsupported_parameter"),
        ("web_search_options", {}, "unsupported_parameter"),
        (
            "moderation",
            {"model": "omni-moderation-latest", "policy": {"input": {"mode": "block"}}},
            "unsupported_parameter",
        ),
        ("reasoning_effort", "high", "unsupported_value"),
        ("verbosity", "low", "unsupported_value"),
    ],
)
def test_sdk_hears_an_audio_reply_or_a_web_search_refused_by_name(
    sdk: openai.OpenAI, field: str, value: Any, code: str
) -> None:
    """A client asking for audio got 200 and text alone, one asking for a search an answer from
    nothing searched: refused by name, as OpenAI refuses them for a model without them. So is a
    moderated completion (the SDK's `moderation`): one asking to block flagged input or output got
    200 and a reply nothing moderated, with no `moderation` results to tell it so. And one asking for
    "high" reasoning effort or "low" verbosity took the model's ordinary reply for it; what the model
    does anyway ("none", "medium") is taken."""
    messages: list[Any] = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.BadRequestError) as info:
        sdk.chat.completions.create(model=MODEL, messages=messages, max_tokens=2, extra_body={field: value})
    assert (info.value.param, info.value.code) == (field, code)
    asks_nothing_of = {"modalities": ["text"], "reasoning_effort": "none", "verbosity": "medium"}
    for asks_nothing in (None, asks_nothing_of[field]) if field in asks_nothing_of else (None,):
        reply = sdk.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=2, extra_body={field: asks_nothing}
        )
        assert reply.choices[0].finish_reason in ("stop", "length")


def _sdk_reply(sdk: openai.OpenAI, stream: bool, **extra: Any) -> tuple[str, str | None]:
    """The reply's text and finish_reason, streamed or not, for a greedy request."""
    messages: list[Any] = [{"role": "user", "content": "Tell me a story"}]
    if not stream:
        done = sdk.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=40, temperature=0, **extra
        )
        return done.choices[0].message.content or "", done.choices[0].finish_reason
    text, finish = "", None
    for chunk in sdk.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=40, temperature=0, stream=True, **extra
    ):
        for choice in chunk.choices:
            text += choice.delta.content or ""
            finish = choice.finish_reason or finish
    return text, finish


@pytest.mark.parametrize("stream", [False, True])
def test_sdk_include_stop_str_in_output_keeps_the_stop_string(sdk: openai.OpenAI, stream: bool) -> None:
    """vLLM's include_stop_str_in_output: the reply ends where the stop string does, and holds it."""
    full, _ = _sdk_reply(sdk, stream)
    # A stop string from the middle of the greedy reply, spanning tokens, not seen earlier in it.
    cut = next(i for i in range(10, len(full) - 5) if full.find(full[i : i + 5]) == i)
    stop = full[cut : cut + 5]
    assert _sdk_reply(sdk, stream, stop=[stop]) == (full[:cut], "stop")
    kept = _sdk_reply(sdk, stream, stop=["@@never@@", stop], extra_body={"include_stop_str_in_output": True})
    assert kept == (full[: cut + 5], "stop")
    # False, as vLLM's default: left out.
    left = _sdk_reply(sdk, stream, stop=[stop], extra_body={"include_stop_str_in_output": False})
    assert left == (full[:cut], "stop")


VLLM_UNAPPLIED: dict[str, tuple[Any, Any]] = {
    # name: (a value that asks for something, one that asks for nothing)
    "min_p": (0.99, 0.0),
    "allowed_token_ids": ([42], None),
    "bad_words": (["Paris"], []),
    "prompt_logprobs": (1, None),
    "best_of": (3, 1),
    "use_beam_search": (True, False),
    "echo": (True, False),
    "truncate_prompt_tokens": (8, None),
    "chat_template": ("{{ messages[0].content }}", None),
    # Ignored before: a reply of special tokens came back as "" (vLLM writes their text).
    "skip_special_tokens": (False, True),
    "spaces_between_special_tokens": (False, True),
    "add_special_tokens": (True, False),
    # Ignored before: vLLM itself refuses it unless started with --logits-processor-pattern.
    "logits_processors": ([{"qualname": "my_module.NoRepeats", "kwargs": {"n": 3}}], []),
}


@pytest.mark.parametrize("field", sorted(VLLM_UNAPPLIED))
def test_sdk_hears_vllm_extensions_no_replica_applies_refused_by_name(sdk: openai.OpenAI, field: str) -> None:
    """Each answered 200 with the reply as if it had not been sent (min_p 0.99 at temperature 1.5:
    the same random text; bad_words ["Paris"]: "Paris" in the reply), against the README's
    "refused by name, never ignored"."""
    messages: list[Any] = [{"role": "user", "content": "hi"}]
    asks, asks_nothing = VLLM_UNAPPLIED[field]
    with pytest.raises(openai.BadRequestError) as info:
        sdk.chat.completions.create(model=MODEL, messages=messages, max_tokens=2, extra_body={field: asks})
    assert (info.value.param, info.value.code) == (field, "unsupported_parameter")
    reply = sdk.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=2, extra_body={field: asks_nothing}
    )
    assert reply.choices[0].finish_reason in ("stop", "length")


def test_sdk_does_not_retry_a_token_budget_that_refills_in_minutes(tmp_path: Path) -> None:
    """A 429 whose Retry-After is past what an SDK waits out (60 s for the 1.x SDKs, which then
    retry after 0.5 s and 1 s) says x-should-retry: false, so no SDK asks again at once."""
    paid = {**ROOMY_TIERS["paid"], "tokens_per_window": 60, "token_window_s": 3600}
    with start_server(tmp_path, {"tiers": {**ROOMY_TIERS, "paid": paid}}) as live:
        sdk = openai.OpenAI(base_url=live.base_url + "/v1", api_key=live.keys["paid"], max_retries=2)
        messages: list[Any] = [{"role": "user", "content": "hi"}]
        sdk.chat.completions.create(model=MODEL, messages=messages, max_tokens=30)
        before = live.rejected(429)
        with pytest.raises(openai.RateLimitError) as info:
            sdk.chat.completions.create(model=MODEL, messages=messages, max_tokens=30)
        sdk.close()
        assert (info.value.code, info.value.type) == ("rate_limit_exceeded", "tokens")
        assert int(info.value.response.headers["retry-after"]) > 60
        assert info.value.response.headers["x-should-retry"] == "false"
        assert live.rejected(429) - before == 1


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("top_p", [0.0, 1e-300])
def test_sdk_top_p_zero_samples_the_most_likely_token(sdk: openai.OpenAI, stream: bool, top_p: float) -> None:
    """OpenAI takes top_p from 0 to 1, and code written for it sends temperature and top_p 0 for the
    steadiest reply: that was a 400 here. A nucleus of no mass is the most likely token alone, so at
    any temperature the reply is the greedy one (as is one below float32's smallest normal number,
    what a replica's FP32 tensor holds: both are sent as greedy)."""
    greedy = _sdk_reply(sdk, stream)
    hot: Any = {"seed": 1, "extra_body": {"temperature": 1.5}}
    assert _sdk_reply(sdk, stream, top_p=1.0, **hot) != greedy
    assert _sdk_reply(sdk, stream, top_p=top_p, **hot) == greedy


@pytest.mark.parametrize(
    ("field", "value", "supported"),
    [
        ("tool_choice", "None", "'none', 'auto', and 'required'"),
        ("tool_choice", "any", "'none', 'auto', and 'required'"),
        ("function_call", "required", "'none' and 'auto'"),
    ],
)
def test_sdk_hears_a_tool_choice_that_is_no_choice_named_as_invalid(
    sdk: openai.OpenAI, field: str, value: str, supported: str
) -> None:
    """A misspelt choice ("None") was told it asked for tool calls, and to send 'none', as if the
    server had understood it: OpenAI answers it as the invalid value it is, naming the ones it takes."""
    messages: list[Any] = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.BadRequestError) as info:
        sdk.chat.completions.create(model=MODEL, messages=messages, max_tokens=2, extra_body={field: value})
    assert (info.value.param, info.value.code) == (field, "invalid_value")
    assert isinstance(info.value.body, dict)
    assert info.value.body["message"] == f"Invalid value: '{value}'. Supported values are: {supported}."


def test_sdk_top_p_zero_is_sent_to_the_replica_as_greedy(tmp_path: Path) -> None:
    """top_p 0 is OpenAI's greedy. It was sent as a nucleus of float32's smallest normal mass at the
    request's temperature: a replica ranks the float32 weights, and where the two largest logits
    lay under one float32 step apart (logits below 1), exp() rounded their weights to one value and
    the sort's tie went to the lower token id, not the larger logit. Now the replica is asked for
    greedy decoding, which both paths pick by the logits themselves."""
    asked: list[GenerationRequest] = []

    async def recorded(inner: Upstream, req: GenerationRequest) -> AsyncIterator[Delta]:
        asked.append(req)
        async for delta in inner.generate(req):
            yield delta

    messages: list[Any] = [{"role": "user", "content": "Tell me a story"}]
    with start_server(tmp_path, {"tiers": ROOMY_TIERS}, scripted_replicas(recorded)) as server:
        client = openai.OpenAI(base_url=server.base_url + "/v1", api_key=server.keys["paid"], max_retries=0)
        with client:
            client.chat.completions.create(
                model=MODEL, messages=messages, max_tokens=4, top_p=0.0, temperature=1.5, seed=1
            )
    (req,) = asked
    # Token 1's logit is the larger by one float32 step; at 1.5 both weigh exp(0) in float32.
    near_tie = np.array([0.5 - 2**-25, 0.5], dtype=np.float32)
    assert sample(near_tie, sampling_params(req), np.random.default_rng(1)) == 1  # the engine's
    body = generate_body(req)  # TensorRT-LLM's
    assert (body["runtime_top_k"], body["temperature"]) == ([1], [1.0])


# The demo model's ChatML with the speaker's name after the role, as templates that read `name` write it.
NAMED_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] }}{% if message.name %}{{ ' ' + message.name }}{% endif %}"
    "{{ '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def test_sdk_sends_function_messages_and_names_that_reach_the_chat_template(tmp_path: Path) -> None:
    """A `function` message (OpenAI's deprecated reply to a function_call, which it and vLLM still
    take) was refused as an invalid role, and a message's `name` never reached the chat template
    (vLLM gives the template the whole message): a template that writes who spoke read no one."""
    model_dir = tmp_path / "named-model"
    shutil.copytree(demo_model_dir(), model_dir)
    config_path = model_dir / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config_path.write_text(json.dumps({**config, "chat_template": NAMED_TEMPLATE}), encoding="utf-8")
    messages: list[Any] = [
        {"role": "user", "name": "alice", "content": "What is the weather?"},
        {"role": "assistant", "content": None, "function_call": {"name": "weather", "arguments": "{}"}},
        {"role": "function", "name": "weather", "content": "sunny"},
    ]
    settings = {"tiers": ROOMY_TIERS, "model": {"demo_dir": str(model_dir)}}
    with start_server(tmp_path / "edge", settings) as live:
        client = openai.OpenAI(base_url=live.base_url + "/v1", api_key=live.keys["paid"], max_retries=0)
        with client:
            reply = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2)
            # A function message names its function, as OpenAI requires.
            with pytest.raises(openai.BadRequestError) as info:
                client.chat.completions.create(
                    model=MODEL,
                    messages=[*messages[:2], {"role": "function", "content": "sunny"}],
                    max_tokens=2,
                )
    assert (info.value.param, info.value.code) == ("messages[2].name", "missing_required_parameter")
    template_reads = [
        {"role": "user", "name": "alice", "content": "What is the weather?"},
        {"role": "assistant", "content": ""},
        {"role": "function", "name": "weather", "content": "sunny"},
    ]
    text = ModelText.load(model_dir)
    assert "<|im_start|>user alice\n" in text.template.render(template_reads)
    assert reply.usage is not None and reply.usage.prompt_tokens == len(text.encode_chat(template_reads))


# vLLM's extensions this server reads, which clients written for vLLM send in extra_body.
VLLM_READ = (
    "top_k",
    "repetition_penalty",
    "ignore_eos",
    "min_tokens",
    "stop_token_ids",
    "include_stop_str_in_output",
    "add_generation_prompt",
    "continue_final_message",
)


def test_sdk_sends_every_optional_field_as_null_and_is_answered_as_if_it_sent_none(
    sdk: openai.OpenAI,
) -> None:
    """Clients that fill every field send null for those they leave unset, and the SDK sends a
    parameter given as None as null. Each such null asks for nothing, as the field left out: vLLM's
    ignore_eos, include_stop_str_in_output, add_generation_prompt and continue_final_message were a
    400 (`Expected bool, got null`). Every parameter the installed SDK's create() takes is sent."""
    taken = inspect.signature(openai.resources.chat.completions.Completions.create).parameters
    unsent = {"self", "messages", "model", "extra_headers", "extra_query", "extra_body", "timeout"}
    nulls: dict[str, Any] = {name: None for name in taken if name not in unsent}
    assert {"tools", "tool_choice", "stop", "stream", "response_format"} <= set(nulls)
    messages: list[Any] = [
        {"role": "system", "content": "Be brief.", "name": None},
        {"role": "user", "content": "hi", "name": None},
        {"role": "assistant", "content": "Hello.", "name": None, "tool_calls": None, "refusal": None},
        {"role": "user", "content": [{"type": "text", "text": "Tell me a story"}]},
    ]
    extra = dict.fromkeys(VLLM_READ) | {"max_tokens": 4, "temperature": 0}
    sent = sdk.chat.completions.create(model=MODEL, messages=messages, **nulls, extra_body=extra)
    plain = sdk.chat.completions.create(model=MODEL, messages=messages, max_tokens=4, temperature=0)
    assert sent.choices[0].message.content == plain.choices[0].message.content
    assert sent.usage is not None and plain.usage is not None
    assert sent.usage.prompt_tokens == plain.usage.prompt_tokens
