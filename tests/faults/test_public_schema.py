"""The public listener's OpenAPI document lists only what the public listener serves.

The operator endpoints (`/metrics`, `/v1/internal/...`) answer only on the operator listener; a
public document that listed them invited clients (and fuzzers) to a path that 404s. Fetched from a
real server, every path the document lists is requested on the public listener with a valid key
(the admin key for /v1/admin/*, its path parameters filled with things that exist): none 404s.
Every reference in it resolves within it, the chat request's body schema included.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, cast

import httpx
import jsonschema
import pytest

from edge.keys.record import hash_key, key_id
from edge.openapi import SCHEMA_PATH
from tests.edge.sse_client import CHAT, MODEL
from tests.support.live_server import LiveServer, start_server

ADMIN_KEY = "fg-admin-public-schema-test"
OPERATOR_PATHS = ("/metrics", "/v1/internal/engine")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    settings = {"keys": {"admin_key_sha256": hash_key(ADMIN_KEY)}}
    with start_server(tmp_path_factory.mktemp("public-schema"), settings) as live:
        yield live


def _document(server: LiveServer) -> dict[str, dict[str, object]]:
    doc = httpx.get(server.base_url + SCHEMA_PATH + "/openapi.json", timeout=30).json()
    paths: dict[str, dict[str, object]] = doc["paths"]
    return paths


def _existing(server: LiveServer, client: httpx.Client) -> dict[str, str]:
    """A value that exists for each path parameter the document uses."""
    conversation = "public-schema-conversation"
    done = client.post(
        CHAT,
        json={
            "model": MODEL,
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 2,
            "conversation_id": conversation,
        },
        headers=server.auth("paid"),
    )
    assert done.status_code == 200
    return {
        "model_id": MODEL,
        "conversation_id": conversation,
        "request_id": done.headers["x-request-id"],  # finished: cancel answers 409, not 404
        "key_id": key_id(hash_key(server.keys["free"])),
    }


def test_operator_endpoints_are_not_in_the_public_document(server: LiveServer) -> None:
    paths = _document(server)
    assert not [p for p in paths if p in OPERATOR_PATHS or p.startswith("/v1/internal/")]
    for path in OPERATOR_PATHS:  # still served where they belong
        assert httpx.get(server.ops_url + path, timeout=30).status_code == 200


def test_every_path_in_the_public_document_answers_on_the_public_listener(server: LiveServer) -> None:
    answers: dict[str, int] = {}
    with httpx.Client(base_url=server.base_url, timeout=60) as client:
        values = _existing(server, client)
        for template, operations in _document(server).items():
            path = template.format(**values)
            if path.endswith("/revoke"):  # another key: a revoked one cannot be rotated after
                path = template.format(**values | {"key_id": key_id(hash_key(server.keys["free2"]))})
            key = ADMIN_KEY if path.startswith("/v1/admin/") else server.keys["paid"]
            for method in operations:
                # No body, or an empty one: a 4xx about the body is an answer, a 404 is not.
                body = {} if method == "post" else None
                response = client.request(
                    method.upper(), path, json=body, headers={"Authorization": f"Bearer {key}"}
                )
                answers[f"{method.upper()} {template}"] = response.status_code
    assert answers and not {op: status for op, status in answers.items() if status == 404}, answers


def _refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        if isinstance(node.get("$ref"), str):
            yield node["$ref"]
        for value in node.values():
            yield from _refs(value)
    elif isinstance(node, list):
        for value in node:
            yield from _refs(value)


def _resolve(doc: dict[str, Any], ref: str) -> Any:
    assert ref.startswith("#/"), ref
    node: Any = doc
    for part in ref[2:].split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        assert isinstance(node, dict) and part in node, f"{ref} does not resolve in the document"
        node = node[part]
    return node


def test_every_reference_in_the_public_document_resolves(server: LiveServer) -> None:
    """The chat body's schema was a $ref to #/components/schemas/ChatCompletionRequest, which Litestar
    left out of the document it serves (it replaces components.schemas with its own): clients and
    fuzzers (tests/faults/test_schemathesis.py) read a request body they could not resolve, and
    Schemathesis sent none."""
    doc = httpx.get(server.base_url + SCHEMA_PATH + "/openapi.json", timeout=30).json()
    for ref in _refs(doc):
        _resolve(doc, ref)
    body = doc["paths"][CHAT]["post"]["requestBody"]["content"]["application/json"]["schema"]
    if "$ref" in body:
        body = _resolve(doc, body["$ref"])
    assert "messages" in body["required"]
    assert body["properties"]["temperature"]["anyOf"][0]["maximum"] == 2.0


def test_admin_bodies_are_in_the_public_document(server: LiveServer) -> None:
    """The admin POSTs read their JSON bodies themselves, so Litestar documented none: a client built
    from the document (or Schemathesis) sent POST /v1/admin/keys with no body, and its 400 said
    `user` and `tier` were missing, which the document never mentioned."""
    paths = _document(server)
    bodies = {
        template: cast(dict[str, Any], operations["post"]).get("requestBody")
        for template, operations in paths.items()
        if template.startswith("/v1/admin/keys") and "post" in operations
    }
    create = bodies["/v1/admin/keys"]
    assert create is not None and create["required"] is True
    assert set(create["content"]["application/json"]["schema"]["required"]) == {"user", "tier"}
    tier = bodies["/v1/admin/keys/{key_id}/tier"]
    assert tier is not None and tier["required"] is True
    assert tier["content"]["application/json"]["schema"]["required"] == ["tier"]
    rotate = bodies["/v1/admin/keys/{key_id}/rotate"]  # an empty body rotates with the default grace
    assert rotate is not None and rotate["required"] is False
    assert "grace_s" in rotate["content"]["application/json"]["schema"]["properties"]

    # What the document says is required, the server requires; what it documents, the server takes.
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    with httpx.Client(base_url=server.base_url, timeout=30, headers=admin) as client:
        refused = client.post("/v1/admin/keys")
        assert refused.status_code == 400, refused.text
        created = client.post("/v1/admin/keys", json={"user": "documented-user", "tier": "free"})
        assert created.status_code == 201, created.text


def _query(paths: dict[str, dict[str, object]], template: str) -> dict[str, dict[str, Any]]:
    operation = cast(dict[str, Any], paths[template]["get"])
    return {p["name"]: p["schema"] for p in operation["parameters"] if p["in"] == "query"}


def test_list_query_parameters_are_documented_as_the_server_reads_them(server: LiveServer) -> None:
    """The list endpoints read their query parameters by hand (OpenAI-style errors), so Litestar
    documented each as any string: `limit` a string, `order` and the days anything. Schemathesis's
    positive_data_acceptance sent what the document allowed (`limit=`, `end=0`, `order=`, `after=`)
    and every one was a 400, and a client generated from the document typed `limit` as a string."""
    paths = _document(server)
    pages = {
        "/v1/usage": (100, 1000),
        "/v1/conversations/{conversation_id}/messages": (100, 1000),
        "/v1/admin/keys": (20, 100),
        "/v1/admin/usage": (100, 1000),
    }
    for template, (default, maximum) in pages.items():
        limit = _query(paths, template)["limit"]
        assert limit == {"type": "integer", "minimum": 1, "maximum": maximum, "default": default}, template
    history = _query(paths, "/v1/conversations/{conversation_id}/messages")
    assert history["order"]["enum"] == ["asc", "desc"]
    for cursor in ("after", "before"):
        assert history[cursor]["pattern"] == "^[0-9A-HJKMNP-TV-Z]{26}$"
    assert _query(paths, "/v1/admin/keys")["after"]["pattern"] == "^key_[0-9a-f]{12,64}$"
    for template in ("/v1/usage", "/v1/admin/usage"):
        for bound in ("start", "end"):  # a day, or empty: no bound
            day = _query(paths, template)[bound]
            assert {"type": "string", "format": "date"} in day["anyOf"], (template, bound)
            assert {"type": "string", "maxLength": 0} in day["anyOf"], (template, bound)
        assert _query(paths, template)["after"] == {"type": "string", "pattern": "^usage_", "maxLength": 4096}
    assert _query(paths, "/v1/admin/usage")["user"]["pattern"] == "\\S"

    # What it documents is what the server takes, at the edges of each bound.
    with httpx.Client(base_url=server.base_url, timeout=30, headers=server.auth("paid")) as client:
        bounds = {"limit": 1000, "start": "", "end": "2026-01-31"}
        assert client.get("/v1/usage", params=bounds).status_code == 200
        assert client.get("/v1/usage", params={"limit": 1001}).status_code == 400
        assert client.get("/v1/usage", params={"limit": 0}).status_code == 400
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    with httpx.Client(base_url=server.base_url, timeout=30, headers=admin) as client:
        assert client.get("/v1/admin/keys", params={"limit": 100}).status_code == 200
        assert client.get("/v1/admin/keys", params={"limit": 101}).status_code == 400


def _body_schema(paths: dict[str, dict[str, object]], template: str) -> dict[str, Any]:
    operation = cast(dict[str, Any], paths[template]["post"])
    return cast(dict[str, Any], operation["requestBody"]["content"]["application/json"]["schema"])


def test_admin_bodies_are_documented_as_the_server_reads_them(server: LiveServer) -> None:
    """The document allowed an empty `user` or `tier` and a negative `grace_s` (Schemathesis's
    positive examples sent them), and the server refused each with a 400 naming it. Each body the
    server refuses, the document refuses too; each the server takes, the document allows; and the
    server's answer is still the OpenAI error naming the parameter."""
    paths = _document(server)
    fresh = "key_" + "0" * 12  # a key id for the document's checks alone: never requested
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    with httpx.Client(base_url=server.base_url, timeout=30, headers=admin) as client:
        rotated = client.post("/v1/admin/keys", json={"user": "rotated-user", "tier": "free"}).json()["id"]
        refused = [
            ("/v1/admin/keys", "/v1/admin/keys", {"user": "", "tier": "free"}, "user"),
            ("/v1/admin/keys", "/v1/admin/keys", {"user": "  ", "tier": "free"}, "user"),
            ("/v1/admin/keys", "/v1/admin/keys", {"user": "u", "tier": ""}, "tier"),
            (
                "/v1/admin/keys",
                "/v1/admin/keys",
                {"user": "u", "tier": "free", "expires_in_s": 0},
                "expires_in_s",
            ),
            (
                "/v1/admin/keys",
                "/v1/admin/keys",
                {"user": "u", "tier": "free", "expires_in_s": 4e9},
                "expires_in_s",
            ),
            ("/v1/admin/keys", "/v1/admin/keys", {"user": "u", "tier": "free", "label": "x" * 1025}, "label"),
            (
                "/v1/admin/keys/{key_id}/rotate",
                f"/v1/admin/keys/{rotated}/rotate",
                {"grace_s": -1},
                "grace_s",
            ),
            (
                "/v1/admin/keys/{key_id}/rotate",
                f"/v1/admin/keys/{rotated}/rotate",
                {"grace_s": 4e9},
                "grace_s",
            ),
            ("/v1/admin/keys/{key_id}/tier", f"/v1/admin/keys/{fresh}/tier", {"tier": ""}, "tier"),
        ]
        for template, path, body, param in refused:
            document = _body_schema(paths, template)
            assert not jsonschema.Draft202012Validator(document).is_valid(body), (template, body)
            answer = client.post(path, json=body)
            assert answer.status_code == 400, (body, answer.text)
            assert answer.json()["error"]["param"] == param, (body, answer.text)
        taken = [
            (
                "/v1/admin/keys",
                "/v1/admin/keys",
                {"user": "u", "tier": "free", "expires_in_s": 3.15e9, "label": "x" * 1024},
            ),
            ("/v1/admin/keys/{key_id}/rotate", f"/v1/admin/keys/{rotated}/rotate", {"grace_s": 0}),
        ]
        for template, path, body in taken:
            assert jsonschema.Draft202012Validator(_body_schema(paths, template)).is_valid(body), (
                template,
                body,
            )
            answer = client.post(path, json=body)
            assert answer.is_success, (body, answer.text)


def test_a_message_without_content_is_documented_as_the_server_reads_it(server: LiveServer) -> None:
    """Only an assistant's message may come without content, as OpenAI takes it (a tool's result is
    required content there); a function's may be null but must be there, with its function's name.
    The document allowed any role to leave it out, and a tool message without content (generated
    from the document) was a 400 'Missing required parameter'."""
    doc = httpx.get(server.base_url + SCHEMA_PATH + "/openapi.json", timeout=30).json()
    document = jsonschema.Draft202012Validator(
        doc["paths"][CHAT]["post"]["requestBody"]["content"]["application/json"]["schema"]
    )
    messages: list[tuple[dict[str, Any], bool]] = [
        ({"role": "tool"}, False),
        ({"role": "tool", "content": None}, False),
        ({"role": "tool", "content": "42"}, True),
        ({"role": "user"}, False),
        ({"role": "system"}, False),
        ({"role": "developer"}, False),
        ({"role": "user", "content": []}, False),
        ({"role": "function", "name": "f"}, False),
        ({"role": "function", "content": "42"}, False),
        ({"role": "function", "name": "f", "content": None}, True),
        ({"role": "assistant"}, True),
        ({"role": "assistant", "content": None}, True),
    ]
    with httpx.Client(base_url=server.base_url, timeout=30, headers=server.auth("paid")) as client:
        for message, taken in messages:
            body = {
                "model": MODEL,
                "max_tokens": 2,
                "messages": [{"role": "user", "content": "hi"}, message, {"role": "user", "content": "and?"}],
            }
            answer = client.post(CHAT, json=body)
            assert answer.is_success is taken, (message, answer.text)
            assert document.is_valid(body) is taken, message
