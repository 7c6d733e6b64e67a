"""Tier routing through the real edge: what each tier sees, and what it may not use."""

from __future__ import annotations

import json
from typing import Any

import httpx
import msgspec

from edge.keys.provision import create_keys
from gpu_container.engine.front import EngineFront
from tests.edge.sse_client import CHAT
from tests.models.conftest import LARGE, SMALL, replicas_of
from tests.support.live_server import LiveServer

HI = [{"role": "user", "content": "hi"}]


def _chat(server: LiveServer, who: str, model: str, **extra: Any) -> httpx.Response:
    body = {"model": model, "messages": HI, "max_tokens": 4} | extra
    return httpx.post(server.base_url + CHAT, json=body, headers=server.auth(who), timeout=60.0)


def test_models_lists_what_the_tier_may_use_default_first(two_models: LiveServer) -> None:
    for who, expected in (("free", [SMALL]), ("paid", [LARGE, SMALL])):
        answer = httpx.get(two_models.base_url + "/v1/models", headers=two_models.auth(who))
        assert answer.status_code == 200
        assert [card["id"] for card in answer.json()["data"]] == expected
    allowed = httpx.get(two_models.base_url + f"/v1/models/{SMALL}", headers=two_models.auth("free"))
    assert allowed.status_code == 200 and allowed.json()["id"] == SMALL


def test_each_model_answers_as_itself_on_its_own_replica(two_models: LiveServer) -> None:
    for model in (SMALL, LARGE):
        before = {m: _generated(two_models, m) for m in (SMALL, LARGE)}
        answer = _chat(two_models, "paid", model)
        assert answer.status_code == 200, answer.text
        assert answer.json()["model"] == model
        generated = answer.json()["usage"]["completion_tokens"]
        other = LARGE if model == SMALL else SMALL
        assert _generated(two_models, model) - before[model] >= generated > 0
        assert _generated(two_models, other) == before[other]
        assert replicas_of(two_models, model)


def _generated(server: LiveServer, model: str) -> int:
    total = 0
    for upstream in replicas_of(server, model):
        assert isinstance(upstream, EngineFront)
        total += upstream.stats().generated_tokens
    return total


def test_an_empty_model_is_the_tiers_default(two_models: LiveServer) -> None:
    assert _chat(two_models, "free", "").json()["model"] == SMALL
    assert _chat(two_models, "paid", "").json()["model"] == LARGE


def test_a_request_naming_no_model_or_null_gets_the_tiers_default(two_models: LiveServer) -> None:
    """vLLM takes `model` as optional (its default model); here it was a 400 "missing required
    field", though an empty `model` already meant the key's default."""
    url = two_models.base_url + CHAT
    for who, expected in (("free", SMALL), ("paid", LARGE)):
        for body in ({"messages": HI, "max_tokens": 4}, {"model": None, "messages": HI, "max_tokens": 4}):
            answer = httpx.post(url, json=body, headers=two_models.auth(who), timeout=60.0)
            assert answer.status_code == 200, answer.text
            assert answer.json()["model"] == expected


def test_a_forbidden_model_answers_exactly_as_a_missing_one(two_models: LiveServer) -> None:
    """Same status, same body (but the name asked for): a free key cannot tell `large` exists."""
    forbidden = _chat(two_models, "free", LARGE)
    missing = _chat(two_models, "free", "no-such-model")
    assert forbidden.status_code == missing.status_code == 404
    assert forbidden.json()["error"]["code"] == "model_not_found"
    assert forbidden.json() == json.loads(missing.text.replace("no-such-model", LARGE))
    assert forbidden.headers["content-type"] == missing.headers["content-type"]

    url = two_models.base_url + "/v1/models/"
    card_forbidden = httpx.get(url + LARGE, headers=two_models.auth("free"))
    card_missing = httpx.get(url + "no-such-model", headers=two_models.auth("free"))
    assert card_forbidden.status_code == card_missing.status_code == 404
    assert card_forbidden.json() == json.loads(card_missing.text.replace("no-such-model", LARGE))
    # And the paid key, which may use it, gets it.
    assert _chat(two_models, "paid", LARGE).status_code == 200


def test_sampling_defaults_apply_when_omitted_and_the_request_wins(two_models: LiveServer) -> None:
    """`large` defaults to temperature 0 (greedy): two seeds agree. Asked for temperature 1, or on
    `small` (the checkpoint's default, 1.0), the seeds give different replies."""

    def reply(model: str, seed: int, **extra: Any) -> str:
        answer = _chat(two_models, "paid", model, seed=seed, max_tokens=24, **extra)
        assert answer.status_code == 200, answer.text
        text: str = answer.json()["choices"][0]["message"]["content"]
        return text

    assert reply(LARGE, 1) == reply(LARGE, 2) == reply(LARGE, 3)
    assert len({reply(LARGE, s, temperature=1.0) for s in (1, 2, 3)}) > 1
    assert len({reply(SMALL, s) for s in (1, 2, 3)}) > 1
    # And an explicit temperature 0 on `small` is greedy too: the request's value wins both ways.
    assert reply(SMALL, 1, temperature=0.0) == reply(SMALL, 2, temperature=0.0)


def test_a_key_of_an_unconfigured_tier_is_refused_its_models_as_its_chat(two_models: LiveServer) -> None:
    """A key whose tier the settings no longer name (a tier renamed or removed, its keys left): the
    models list answered 200 with no models, and a model's card 404, while its chat answers 403
    unknown_tier; a client read that as an edge serving nothing, not as a key to fix."""
    settings = two_models.settings
    with_gold = msgspec.structs.replace(settings, tiers={**settings.tiers, "gold": settings.tiers["paid"]})
    gold = {"Authorization": "Bearer " + create_keys(with_gold, {"k": ("unlisted-gold-user", "gold")})["k"]}
    chat = httpx.post(
        two_models.base_url + CHAT, json={"messages": HI, "max_tokens": 4}, headers=gold, timeout=60.0
    )
    assert chat.status_code == 403 and chat.json()["error"]["code"] == "unknown_tier", chat.text
    for path in ("/v1/models", f"/v1/models/{SMALL}"):
        answer = httpx.get(two_models.base_url + path, headers=gold)
        assert answer.status_code == 403, (path, answer.text)
        assert answer.json()["error"] == chat.json()["error"], path
