"""Each error answer of the edge reaches the caller as its own type, with the server's fields."""

from __future__ import annotations

import math

import anyio
import pytest

from floodgate_client import (
    AsyncClient,
    AuthenticationError,
    BadRequestError,
    Client,
    ConflictError,
    NotFoundError,
    TextDelta,
)
from tests.client.live import LONG_REPLY, LONG_REPLY_TOKENS
from tests.support.live_server import LiveServer


def test_an_unknown_key_is_an_authentication_error(server: LiveServer) -> None:
    with Client(server.base_url, "fg-not-a-real-key") as client, pytest.raises(AuthenticationError) as caught:
        client.chat.stream("hi", model="floodgate-tiny", max_tokens=2)
    assert caught.value.status_code == 401 and caught.value.message


def test_an_out_of_range_parameter_is_a_bad_request_naming_it(server: LiveServer) -> None:
    with Client(server.base_url, server.keys["paid"]) as client, pytest.raises(BadRequestError) as caught:
        client.chat.stream("hi", temperature=7.5, max_tokens=2)
    assert caught.value.status_code == 400 and caught.value.param == "temperature"


def test_an_unknown_model_is_not_found(server: LiveServer) -> None:
    with Client(server.base_url, server.keys["paid"]) as client, pytest.raises(NotFoundError) as caught:
        client.chat.create("hi", model="no-such-model", max_tokens=2)
    assert caught.value.param == "model"


def test_cancelling_an_unknown_request_is_not_found(server: LiveServer) -> None:
    with Client(server.base_url, server.keys["paid"]) as client, pytest.raises(NotFoundError):
        client.chat.cancel("chatcmpl-000000000000000000000000")


def test_another_users_request_is_not_found_and_a_finished_one_conflicts(server: LiveServer) -> None:
    with (
        Client(server.base_url, server.keys["paid"]) as owner,
        Client(server.base_url, server.keys["free2"]) as other,
    ):
        with owner.chat.stream(
            LONG_REPLY.prompt, max_tokens=LONG_REPLY_TOKENS, temperature=LONG_REPLY.temperature
        ) as stream:
            next(event for event in stream if isinstance(event, TextDelta))
            assert stream.request_id is not None
            with pytest.raises(NotFoundError):
                other.chat.cancel(stream.request_id)
            assert stream.cancel() is True, "the other user's cancel must not have stopped it"
        # Cancelled, a repeat is answered as the first; ended on its own, a cancel conflicts.
        assert owner.chat.cancel(stream.request_id) == "CANCELLED"
        with owner.chat.stream("hi", max_tokens=2) as short:
            list(short)
        assert short.request_id is not None
        with pytest.raises(ConflictError) as caught:
            owner.chat.cancel(short.request_id)
    assert caught.value.status_code == 409 and caught.value.code == "request_finished"


@pytest.mark.parametrize("make", [Client, AsyncClient])
@pytest.mark.parametrize("option", ["temperature", "top_p"])
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_a_parameter_json_cannot_carry_is_refused_naming_it(
    server: LiveServer, make: type[Client] | type[AsyncClient], option: str, value: float
) -> None:
    # JSON has no NaN or infinity: httpx's encoding raised "Out of range float values are not JSON
    # compliant", naming no parameter, from inside the request's sending.
    temperature = value if option == "temperature" else None
    top_p = value if option == "top_p" else None

    async def main() -> None:
        async with AsyncClient(server.base_url, server.keys["paid"]) as client:
            await client.chat.stream("hi", max_tokens=2, temperature=temperature, top_p=top_p)

    with pytest.raises(ValueError, match=rf"^{option} must be a finite number, not {value}$"):
        if make is Client:
            with Client(server.base_url, server.keys["paid"]) as client:
                client.chat.stream("hi", max_tokens=2, temperature=temperature, top_p=top_p)
        else:
            anyio.run(main)
