"""Each error answer of the edge reaches the caller as its own type, with the server's fields."""

from __future__ import annotations

import pytest

from client import AuthenticationError, BadRequestError, Client, ConflictError, NotFoundError, TextDelta
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


def test_another_users_request_cannot_be_cancelled_and_a_finished_one_conflicts(server: LiveServer) -> None:
    with (
        Client(server.base_url, server.keys["paid"]) as owner,
        Client(server.base_url, server.keys["free2"]) as other,
    ):
        with owner.chat.stream("A long answer please", max_tokens=400, seed=11) as stream:
            next(event for event in stream if isinstance(event, TextDelta))
            assert stream.request_id is not None
            with pytest.raises(NotFoundError):
                other.chat.cancel(stream.request_id)
            stream.until_finished()
        assert stream.finished is not None and not stream.finished.cancelled
        with pytest.raises(ConflictError) as caught:
            owner.chat.cancel(stream.request_id)
    assert caught.value.status_code == 409
