"""The API key never shows in an error: a key read with its trailing newline is trimmed, one with a
control character inside is refused without being quoted, and httpx's refusal of a header value (which
quotes it) is not passed on."""

from __future__ import annotations

import anyio
import pytest

from floodgate_client import AsyncClient, Client, FloodgateError, NetworkError
from tests.client.test_cli import chat_cli
from tests.support.live_server import LiveServer


def test_a_key_with_a_trailing_newline_is_trimmed_and_works(server: LiveServer) -> None:
    with Client(server.base_url, server.keys["paid"] + "\n") as client:
        assert client.chat.create("hi", max_tokens=2).request_id

    async def main() -> None:
        async with AsyncClient(server.base_url, " " + server.keys["paid"] + "\r\n") as client:
            assert (await client.chat.create("hi", max_tokens=2)).request_id

    anyio.run(main)


@pytest.mark.parametrize("make", [Client, AsyncClient])
def test_a_key_with_a_control_character_inside_is_refused_without_being_quoted(
    server: LiveServer, make: type[Client] | type[AsyncClient]
) -> None:
    key = server.keys["paid"]
    with pytest.raises(ValueError) as raised:
        make(server.base_url, key[:4] + "\n" + key[4:])
    assert key[4:] not in str(raised.value) and key[:4] not in str(raised.value)


def test_httpx_refusing_a_header_value_does_not_put_it_in_the_error(server: LiveServer) -> None:
    secret = server.keys["paid"] + "-secret"
    with Client(server.base_url, server.keys["paid"]) as client:
        # Past the client's own check: what h11 refuses, quoting the value in its exception.
        client._http.headers["Authorization"] = f"Bearer {secret}\n"
        with pytest.raises(NetworkError) as raised:
            client.chat.create("hi", model="any", max_tokens=2)
    error: BaseException | None = raised.value
    while error is not None:
        assert secret not in str(error)
        error = error.__cause__ or (None if error.__suppress_context__ else error.__context__)

    async def main() -> None:
        async with AsyncClient(server.base_url, server.keys["paid"]) as client:
            client._http.headers["Authorization"] = f"Bearer {secret}\n"
            with pytest.raises(FloodgateError) as raised:
                await client.chat.create("hi", model="any", max_tokens=2)
            assert secret not in str(raised.value) and raised.value.__cause__ is None

    anyio.run(main)


def test_the_cli_trims_the_key_and_never_prints_a_bad_one(server: LiveServer) -> None:
    key = server.keys["paid"]
    proc = chat_cli(server, "hi", "--max-tokens", "2", key=key + "\n")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert key not in err and key not in out
    proc = chat_cli(server, "hi", "--max-tokens", "2", key=key[:4] + "\x01" + key[4:])
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "FLOODGATE_API_KEY" in err
    assert key[4:] not in err and key[4:] not in out
