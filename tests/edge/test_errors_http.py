"""Every refusal is an OpenAI error object with the right status, never a traceback.

The edge refuses these before any replica is asked, so the upstream cannot change the answer: they
run on the in-process path only (`local_server`). A request the edge accepts despite odd fields
reaches the replica, so that one runs on both paths (`server`).
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from edge.text.model_text import ModelText
from tests.edge.conftest import BOTH_PATHS
from tests.edge.sse_client import CHAT, LONG_PROMPT, MODEL
from tests.support.live_server import LiveServer

UPSTREAMS = BOTH_PATHS

OK_BODY: dict[str, Any] = {"model": MODEL, "messages": LONG_PROMPT, "max_tokens": 3}
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}


@pytest.fixture
def local_client(local_server: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=local_server.base_url, timeout=30.0) as c:
        yield c


def _error(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    error: dict[str, Any] = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert "Traceback" not in error["message"]
    return error


@pytest.mark.parametrize(
    "headers", [{}, {"Authorization": "Bearer fg-wrong"}, {"Authorization": "Basic abc"}]
)
def test_401_without_a_valid_key(local_client: httpx.Client, headers: dict[str, str]) -> None:
    error = _error(local_client.post(CHAT, json=OK_BODY, headers=headers), 401)
    assert error["code"] == "invalid_api_key"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": MODEL}, "messages"),
        ({"model": MODEL, "messages": []}, "messages"),
        ({"model": MODEL, "messages": [{"role": "user", "content": 3}]}, "messages[0].content"),
        ({"model": MODEL, "messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
        ({"model": MODEL, "messages": [{"role": "user"}]}, "messages[0].content"),
        ({"model": MODEL, "messages": [{"role": "user", "content": None}]}, "messages[0].content"),
        (
            {
                "model": MODEL,
                "messages": [{"role": "system", "content": None}, {"role": "user", "content": "hi"}],
            },
            "messages[0].content",
        ),
        (OK_BODY | {"temperature": "hot"}, "temperature"),
        (OK_BODY | {"temperature": 3.5}, "temperature"),
        (OK_BODY | {"max_tokens": 0}, "max_tokens"),
        (OK_BODY | {"stream": "yes"}, "stream"),
        (OK_BODY | {"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        (OK_BODY | {"n": 2}, "n"),
        (OK_BODY | {"stream_options": {"include_usage": True}}, "stream_options"),  # not streamed
        (OK_BODY | {"max_tokens": 5000}, "max_tokens"),
        (OK_BODY | {"max_completion_tokens": 5000}, "max_completion_tokens"),
        (OK_BODY | {"response_format": {"type": "yaml"}}, "response_format.type"),
        (OK_BODY | {"top_k": 1025}, "top_k"),  # past TensorRT-LLM's top-k sampling
        (OK_BODY | {"top_k": -2}, "top_k"),
        (OK_BODY | {"repetition_penalty": 0}, "repetition_penalty"),
        (OK_BODY | {"repetition_penalty": 1e-300}, "repetition_penalty"),  # 0 in the replicas' float32
        (OK_BODY | {"repetition_penalty": 11}, "repetition_penalty"),
        (OK_BODY | {"ignore_eos": "yes"}, "ignore_eos"),
        (OK_BODY | {"min_tokens": -1}, "min_tokens"),
        (OK_BODY | {"min_tokens": 4}, "min_tokens"),  # past max_tokens (3), as vLLM refuses it
        (OK_BODY | {"max_tokens": None, "max_completion_tokens": 3, "min_tokens": 4}, "min_tokens"),
        ({"model": MODEL, "messages": LONG_PROMPT, "min_tokens": 2001}, "min_tokens"),  # tier's 2000
        (OK_BODY | {"stop_token_ids": list(range(65))}, "stop_token_ids"),
        (OK_BODY | {"stop_token_ids": [1.5]}, "stop_token_ids[0]"),
    ],
)
def test_400_names_the_bad_parameter(
    local_server: LiveServer, local_client: httpx.Client, body: Any, param: str
) -> None:
    error = _error(local_client.post(CHAT, json=body, headers=local_server.auth("paid")), 400)
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        ({"model": MODEL}, "messages", "missing_required_parameter"),
        ({"model": MODEL, "messages": [{"content": "x"}]}, "messages[0].role", "missing_required_parameter"),
        ({"model": MODEL, "messages": []}, "messages", "empty_array"),
        (
            {"model": MODEL, "messages": [{"role": "user", "content": 3}]},
            "messages[0].content",
            "invalid_type",
        ),
        (OK_BODY | {"temperature": "hot"}, "temperature", "invalid_type"),
        (OK_BODY | {"max_tokens": 2.5}, "max_tokens", "invalid_type"),
        (
            {"model": MODEL, "messages": [{"role": "wizard", "content": "x"}]},
            "messages[0].role",
            "invalid_value",
        ),
        (OK_BODY | {"conversation_id": "a/b"}, "conversation_id", "invalid_value"),
        (OK_BODY | {"temperature": 2.0001}, "temperature", "decimal_above_max_value"),
        (OK_BODY | {"presence_penalty": -2.5}, "presence_penalty", "decimal_below_min_value"),
        (OK_BODY | {"max_tokens": 0}, "max_tokens", "integer_below_min_value"),
        (OK_BODY | {"top_k": 1025}, "top_k", "integer_above_max_value"),
        (OK_BODY | {"stop": ["a", "b", "c", "d", "e"]}, "stop", "array_above_max_length"),
        (OK_BODY | {"user": "u" * 257}, "user", "string_above_max_length"),
    ],
)
def test_400_codes_a_bad_parameter_as_openai_does(
    local_server: LiveServer, local_client: httpx.Client, body: Any, param: str, code: str
) -> None:
    """The edge's own checks gave OpenAI's codes (`missing_required_parameter` for a message without
    content, `empty_array` for one of no parts) and the parser's none: a body without messages, or
    with an empty list of them, was code null. A client branching on the code saw two answers to
    one mistake."""
    error = _error(local_client.post(CHAT, json=body, headers=local_server.auth("paid")), 400)
    assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", param, code)


@pytest.mark.parametrize(
    ("fields", "param", "code"),
    [
        ({"response_format": {"type": "json_object"}}, "response_format", "unsupported_value"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}},
            "response_format",
            "unsupported_value",
        ),
        ({"tools": [TOOL]}, "tools", "unsupported_parameter"),
        ({"tools": [TOOL], "tool_choice": "auto"}, "tools", "unsupported_parameter"),
        ({"tools": [TOOL], "tool_choice": "required"}, "tools", "unsupported_parameter"),
        (
            {"tool_choice": {"type": "function", "function": {"name": "f"}}},
            "tool_choice",
            "unsupported_parameter",
        ),
        ({"functions": [TOOL["function"]]}, "functions", "unsupported_parameter"),
        ({"function_call": {"name": "f"}}, "function_call", "unsupported_parameter"),
        ({"logprobs": True}, "logprobs", "unsupported_parameter"),
        ({"logprobs": True, "top_logprobs": 5}, "logprobs", "unsupported_parameter"),
        ({"top_logprobs": 5}, "top_logprobs", "unsupported_parameter"),
        # vLLM's usage in every chunk: a client counting tokens as they come would see none.
        (
            {"stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}},
            "stream_options.continuous_usage_stats",
            "unsupported_parameter",
        ),
    ],
)
def test_400_for_what_would_change_the_replys_contract(
    local_server: LiveServer, local_client: httpx.Client, fields: dict[str, Any], param: str, code: str
) -> None:
    """A reply held to JSON, a tool call, log-probabilities: prose or zeros in their place would
    fail the client later."""
    body = OK_BODY | fields
    error = _error(local_client.post(CHAT, json=body, headers=local_server.auth("paid")), 400)
    assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", param, code)


IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}


@pytest.mark.parametrize(
    ("content", "param", "code"),
    [
        (
            [{"type": "text", "text": "What is in this picture?"}, IMAGE],
            "messages[1].content[1].type",
            "unsupported_value",
        ),
        (
            [{"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}],
            "messages[1].content[0].type",
            "unsupported_value",
        ),
        ([{"type": "text"}], "messages[1].content[0].text", None),
    ],
)
def test_400_for_a_content_part_the_model_cannot_read(
    local_server: LiveServer,
    local_client: httpx.Client,
    content: list[dict[str, Any]],
    param: str,
    code: str | None,
) -> None:
    """Dropped, an image would leave the model describing a picture it never saw."""
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": content}]
    body = OK_BODY | {"messages": messages}
    error = _error(local_client.post(CHAT, json=body, headers=local_server.auth("paid")), 400)
    assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", param, code)


LONG = "x" * 5_000
SHOWN = "x" * 64 + "…"


@pytest.mark.parametrize(
    ("change", "param"),
    [
        ({"messages": [{"role": LONG, "content": "hi"}]}, "messages[0].role"),
        ({"response_format": {"type": LONG}}, "response_format.type"),
        ({"tool_choice": LONG}, "tool_choice"),
        ({"modalities": [LONG]}, "modalities"),
        (
            {"messages": [{"role": "user", "content": [{"type": LONG, "text": "hi"}]}]},
            "messages[0].content[0].type",
        ),
    ],
    ids=["role", "response_format", "tool_choice", "modalities", "content-part"],
)
def test_a_400_echoes_what_the_client_sent_cut_short(
    local_server: LiveServer, local_client: httpx.Client, change: dict[str, Any], param: str
) -> None:
    """A value refused is echoed in the message at most 64 characters long, as the model's name in
    its 404 is: echoed whole, a role of 200 KB came back in a 200 KB message, for a client to log."""
    error = _error(local_client.post(CHAT, json=OK_BODY | change, headers=local_server.auth("paid")), 400)
    assert error["param"] == param
    assert f"'{SHOWN}'" in error["message"] and len(error["message"]) < 500, error["message"][:300]


def test_text_and_refusal_parts_are_read(local_server: LiveServer, local_client: httpx.Client) -> None:
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "Say hi."}]},
        {"role": "assistant", "content": [{"type": "refusal", "refusal": "I cannot."}]},
        {"role": "user", "content": [{"type": "text", "text": "Please."}, {"type": "text", "text": "Now."}]},
    ]
    as_parts = local_client.post(
        CHAT, json=OK_BODY | {"messages": messages}, headers=local_server.auth("paid")
    )
    as_strings = [
        {"role": "user", "content": "Say hi."},
        {"role": "assistant", "content": "I cannot."},
        {"role": "user", "content": "Please.\nNow."},
    ]
    as_text = local_client.post(
        CHAT, json=OK_BODY | {"messages": as_strings}, headers=local_server.auth("paid")
    )
    assert as_parts.status_code == as_text.status_code == 200
    # The same prompt either way: every part's text reached the template.
    assert as_parts.json()["usage"]["prompt_tokens"] == as_text.json()["usage"]["prompt_tokens"]


def test_400_for_a_logit_bias_token_outside_the_vocabulary(
    local_server: LiveServer, local_client: httpx.Client
) -> None:
    """Refused by the edge, as OpenAI and vLLM refuse it: the replica's logits row has no place for it."""
    vocab = ModelText.load(Path(local_server.settings.model.demo_dir)).vocab_size
    for token in (vocab, -1, 10**30):
        body = OK_BODY | {"logit_bias": {str(token): 5}}
        error = _error(local_client.post(CHAT, json=body, headers=local_server.auth("paid")), 400)
        assert (error["type"], error["param"], error["code"]) == (
            "invalid_request_error",
            "logit_bias",
            "invalid_value",
        )
        assert str(token) in error["message"]
    # The last token of the vocabulary is one like any other.
    body = OK_BODY | {"logit_bias": {str(vocab - 1): 5}}
    assert local_client.post(CHAT, json=body, headers=local_server.auth("paid")).status_code == 200


def test_a_logit_bias_written_as_a_json_float_is_taken_and_applied(
    local_server: LiveServer, local_client: httpx.Client
) -> None:
    """vLLM takes a bias as a float (its dict[str, float]), and a JSON `100.0` is the integer 100
    as JSON Schema reads OpenAI's spec: Python clients write a computed bias so. Both were a 400."""
    tokenizer = ModelText.load(Path(local_server.settings.model.demo_dir)).tokenizer
    greedy = OK_BODY | {"temperature": 0.0, "max_tokens": 6}
    forced = greedy | {"logit_bias": {str(tokenizer.token_to_id("a")): 100.0}}
    response = local_client.post(CHAT, json=forced, headers=local_server.auth("paid"))
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"] == "a" * 6
    fractional = greedy | {"logit_bias": {"5": 0.5, "6": -2.25}}
    response = local_client.post(CHAT, json=fractional, headers=local_server.auth("paid"))
    assert response.status_code == 200, response.text
    # Still bounded as OpenAI bounds it.
    over = greedy | {"logit_bias": {"5": 100.5}}
    error = _error(local_client.post(CHAT, json=over, headers=local_server.auth("paid")), 400)
    assert error["param"] is not None and "logit_bias" in error["param"]


def test_400_for_a_stop_token_id_outside_the_vocabulary(
    local_server: LiveServer, local_client: httpx.Client
) -> None:
    """Refused by the edge, as logit_bias's are: no generated token could ever match it."""
    vocab = ModelText.load(Path(local_server.settings.model.demo_dir)).vocab_size
    for token in (vocab, -1, 10**30):
        body = OK_BODY | {"stop_token_ids": [5, token]}
        error = _error(local_client.post(CHAT, json=body, headers=local_server.auth("paid")), 400)
        assert (error["type"], error["param"], error["code"]) == (
            "invalid_request_error",
            "stop_token_ids",
            "invalid_value",
        )
        assert str(token) in error["message"]
    body = OK_BODY | {"stop_token_ids": [vocab - 1, vocab - 1], "min_tokens": 3}  # at max_tokens: fine
    assert local_client.post(CHAT, json=body, headers=local_server.auth("paid")).status_code == 200


def test_400_on_malformed_json(local_server: LiveServer, local_client: httpx.Client) -> None:
    response = local_client.post(CHAT, content=b"{not json", headers=local_server.auth("paid"))
    assert _error(response, 400)["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    "content_type",
    [
        "text/plain",
        "text/plain;charset=UTF-8",  # a browser's fetch() of a string body, sent with no preflight
        "application/x-www-form-urlencoded",  # curl -d without -H
        "multipart/form-data; boundary=x",
        "application/jsonl",
        "json",
    ],
)
def test_400_for_a_body_not_sent_as_json(
    local_server: LiveServer, local_client: httpx.Client, content_type: str
) -> None:
    """A review: a JSON body labelled as another type was read as JSON all the same. OpenAI answers
    400 `unsupported_content_type` ("This API method only accepts 'application/json' requests");
    vLLM (FastAPI) reads only a JSON type, or none, as JSON, and refuses the rest."""
    headers = local_server.auth("paid") | {"content-type": content_type}
    error = _error(local_client.post(CHAT, content=json.dumps(OK_BODY).encode(), headers=headers), 400)
    assert (error["type"], error["code"], error["param"]) == (
        "invalid_request_error",
        "unsupported_content_type",
        None,
    )
    assert f"'{content_type}'" in error["message"] and "application/json" in error["message"]


def test_an_unsupported_content_type_is_echoed_cut(
    local_server: LiveServer, local_client: httpx.Client
) -> None:
    headers = local_server.auth("paid") | {"content-type": "text/" + "x" * 8000}
    error = _error(local_client.post(CHAT, content=json.dumps(OK_BODY).encode(), headers=headers), 400)
    assert error["code"] == "unsupported_content_type"
    assert ("text/" + "x" * 59) in error["message"] and "x" * 60 not in error["message"]


@pytest.mark.parametrize(
    "content_type",
    [
        None,
        "application/json",
        "Application/JSON; charset=utf-8",
        "application/json ;charset=UTF-8",
        "application/vnd.x+json",
    ],
)
def test_a_body_sent_as_json_or_without_a_type_is_read(
    local_server: LiveServer, local_client: httpx.Client, content_type: str | None
) -> None:
    """Any JSON type (RFC 6839's +json too), its parameters and case whatever they are (OpenAI once
    refused a charset, and took it back), and no type at all, as vLLM reads them."""
    headers = local_server.auth("paid") | ({} if content_type is None else {"content-type": content_type})
    response = local_client.post(CHAT, content=json.dumps(OK_BODY).encode(), headers=headers)
    assert response.status_code == 200, response.text


def test_a_utf8_byte_order_mark_before_the_json_is_skipped(
    local_server: LiveServer, local_client: httpx.Client
) -> None:
    """As Python's json.loads (vLLM) reads it; a 400 "could not parse" before."""
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1})
    sent = b"\xef\xbb\xbf" + body.encode()
    response = local_client.post(CHAT, content=sent, headers=local_server.auth("paid"))
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] == 1
    twice = local_client.post(CHAT, content=b"\xef\xbb\xbf" + sent, headers=local_server.auth("paid"))
    assert _error(twice, 400)["type"] == "invalid_request_error"


def test_unknown_fields_are_ignored_and_text_parts_accepted(server: LiveServer, client: httpx.Client) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}], "name": "x"}],
        "max_completion_tokens": 2,
        "logprobs": False,
        "frequency_penalty": 0,
        # Asking for no JSON and no tool call is asking for what every reply is.
        "response_format": {"type": "text"},
        "tools": [TOOL],
        "tool_choice": "none",
    }
    response = client.post(CHAT, json=body, headers=server.auth("paid"))
    assert response.status_code == 200
    assert response.json()["usage"]["completion_tokens"] <= 2


def test_an_assistant_turn_may_come_without_content(
    local_server: LiveServer, local_client: httpx.Client
) -> None:
    """As OpenAI's history has it after a tool call: the assistant's content null, or not sent."""
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    body = OK_BODY | {
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "assistant"},
            {"role": "user", "content": "and then?"},
        ]
    }
    response = local_client.post(CHAT, json=body, headers=local_server.auth("paid"))
    assert response.status_code == 200, response.text


@pytest.mark.parametrize(
    ("message", "code"),
    [
        ({"role": "user"}, "missing_required_parameter"),
        ({"role": "user", "content": None}, "invalid_type"),
        # No parts: an empty turn, as OpenAI refuses it (it was read as one).
        ({"role": "user", "content": []}, "empty_array"),
    ],
)
def test_a_users_turn_without_content_is_named(
    local_server: LiveServer, local_client: httpx.Client, message: dict[str, Any], code: str
) -> None:
    body = OK_BODY | {"messages": [{"role": "user", "content": "hi"}, message]}
    error = _error(local_client.post(CHAT, json=body, headers=local_server.auth("paid")), 400)
    assert (error["param"], error["code"]) == ("messages[1].content", code)


def test_context_length_exceeded(local_server: LiveServer, local_client: httpx.Client) -> None:
    long_text = " ".join(f"word{i}" for i in range(3000))
    body = {"model": MODEL, "messages": [{"role": "user", "content": long_text}]}
    error = _error(local_client.post(CHAT, json=body, headers=local_server.auth("paid")), 400)
    assert error["code"] == "context_length_exceeded"


def test_a_prompt_too_long_for_the_context_says_so_even_with_max_tokens_over_the_tier(
    local_server: LiveServer, local_client: httpx.Client
) -> None:
    """The client must trim its messages, and only this code tells it: a reply about max_tokens
    alone would have it lower max_tokens and fail again."""
    long_text = " ".join(f"word{i}" for i in range(3000))
    over_tier = local_server.settings.tiers["paid"].max_tokens + 1
    body = {"model": MODEL, "messages": [{"role": "user", "content": long_text}], "max_tokens": over_tier}
    error = _error(local_client.post(CHAT, json=body, headers=local_server.auth("paid")), 400)
    assert (error["code"], error["param"]) == ("context_length_exceeded", "messages")
    # A prompt that fits is told about its max_tokens.
    short = body | {"messages": [{"role": "user", "content": "hi"}]}
    error = _error(local_client.post(CHAT, json=short, headers=local_server.auth("paid")), 400)
    assert error["param"] == "max_tokens" and "Your tier allows at most" in error["message"]


def test_the_context_length_the_model_card_gives_is_the_one_requests_meet(
    local_server: LiveServer, local_client: httpx.Client
) -> None:
    card = local_client.get(f"/v1/models/{MODEL}", headers=local_server.auth("paid")).json()
    listed = local_client.get("/v1/models", headers=local_server.auth("paid")).json()["data"]
    context = card["max_model_len"]
    assert [m["max_model_len"] for m in listed if m["id"] == MODEL] == [context]
    # A prompt leaving less room than the tier's max_tokens: the context is what refuses.
    body = OK_BODY | {"messages": [{"role": "user", "content": " ".join(f"w{i}" for i in range(400))}]}
    one = local_client.post(CHAT, json=body | {"max_tokens": 1}, headers=local_server.auth("paid"))
    prompt = one.json()["usage"]["prompt_tokens"]
    assert context - prompt < local_server.settings.tiers["paid"].max_tokens
    over = body | {"max_tokens": context - prompt + 1}
    error = _error(local_client.post(CHAT, json=over, headers=local_server.auth("paid")), 400)
    assert error["code"] == "context_length_exceeded"
    fits = body | {"max_tokens": context - prompt, "stream": True}
    with local_client.stream("POST", CHAT, json=fits, headers=local_server.auth("paid")) as answer:
        assert answer.status_code == 200  # closed unread: the edge frees the generation


def test_404_for_an_unknown_model(local_server: LiveServer, local_client: httpx.Client) -> None:
    error = _error(
        local_client.post(CHAT, json=OK_BODY | {"model": "gpt-9"}, headers=local_server.auth("paid")), 404
    )
    assert error["code"] == "model_not_found" and error["param"] == "model"


def test_the_404_for_an_unknown_model_echoes_its_name_cut(
    local_server: LiveServer, local_client: httpx.Client
) -> None:
    """A review: the 404 echoed the model the caller named whole (the body's `model`, the path's id
    on /v1/models/{id} and its stats), where every other message cuts what the user sent at 64
    characters: a name of kilobytes came back whole. A real name is never cut."""
    long_name = "gpt-" + "x" * 8000
    auth = local_server.auth("paid")
    cut = f"The model `{long_name[:64]}` does not exist or you do not have access to it."
    answers = [
        local_client.post(CHAT, json=OK_BODY | {"model": long_name}, headers=auth),
        local_client.get(f"/v1/models/{long_name}", headers=auth),
        local_client.get(f"/v1/models/{long_name}/stats", headers=auth),
    ]
    for answer in answers:
        error = _error(answer, 404)
        assert error["code"] == "model_not_found" and error["message"] == cut
    short = _error(local_client.get("/v1/models/gpt-9", headers=auth), 404)
    assert short["message"] == "The model `gpt-9` does not exist or you do not have access to it."


def test_413_for_an_oversized_body(local_server: LiveServer, local_client: httpx.Client) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "x" * 70_000}]}
    error = _error(local_client.post(CHAT, json=body, headers=local_server.auth("paid")), 413)
    assert error["code"] == "request_too_large"


@pytest.mark.parametrize("encoding", ["gzip", "br", "GZIP, identity"])
def test_415_for_a_compressed_body(
    local_server: LiveServer, local_client: httpx.Client, encoding: str
) -> None:
    """The edge decodes no content coding: a gzipped body was read as JSON all the same (a 400
    "could not parse the JSON body", though the JSON was fine), and one merely labelled br was
    served as plain. RFC 9110 15.5.16 and 12.5.3: 415, naming what it accepts."""
    payload = json.dumps(OK_BODY).encode()
    body = gzip.compress(payload) if encoding == "gzip" else payload
    headers = local_server.auth("paid") | {"content-type": "application/json", "content-encoding": encoding}
    response = local_client.post(CHAT, content=body, headers=headers)
    error = _error(response, 415)
    assert error["code"] == "unsupported_content_encoding" and error["type"] == "invalid_request_error"
    assert response.headers["accept-encoding"] == "identity"


def test_an_identity_content_encoding_is_read_as_it_is(
    local_server: LiveServer, local_client: httpx.Client
) -> None:
    headers = local_server.auth("paid") | {"content-encoding": "identity"}
    response = local_client.post(CHAT, json=OK_BODY, headers=headers)
    assert response.status_code == 200, response.text


def test_the_frameworks_own_refusals_are_counted_as_rejected(
    local_server: LiveServer, local_client: httpx.Client
) -> None:
    """413, 404 and 405 come from Litestar's HTTPException, whose handler counted nothing: a flood
    of oversized bodies never showed on /metrics."""
    before = {status: local_server.rejected(status) for status in (413, 404, 405)}
    body = {"model": MODEL, "messages": [{"role": "user", "content": "x" * 70_000}]}
    _error(local_client.post(CHAT, json=body, headers=local_server.auth("paid")), 413)
    _error(local_client.get("/v1/nothing-here"), 404)
    _error(local_client.get(CHAT), 405)

    assert {status: local_server.rejected(status) - before[status] for status in before} == {
        413: 1.0,
        404: 1.0,
        405: 1.0,
    }


def test_unknown_route_and_method_are_openai_errors(local_client: httpx.Client) -> None:
    _error(local_client.get("/v1/nothing-here"), 404)
    _error(local_client.get(CHAT), 405)


def test_the_cancel_of_an_unknown_request_echoes_its_id_cut(
    local_server: LiveServer, local_client: httpx.Client
) -> None:
    """A review: the 404 echoed the id in the path whole, where every other message cuts what the
    user sent at 64 characters: an id of kilobytes came back whole. A real id is never cut."""
    long_id = "chatcmpl-" + "a" * 8000
    error = _error(local_client.post(f"{CHAT}/{long_id}/cancel", headers=local_server.auth("paid")), 404)
    assert error["code"] == "request_not_found"
    assert error["message"] == f"No request {long_id[:64]} in progress."
    short = _error(
        local_client.post(f"{CHAT}/chatcmpl-unknown/cancel", headers=local_server.auth("paid")), 404
    )
    assert short["message"] == "No request chatcmpl-unknown in progress."
