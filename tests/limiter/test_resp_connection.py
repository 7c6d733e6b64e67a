"""limiter/resp_connection.py against a real redis-server: every caller gets its own reply however many
share the connection, one that gave up does not shift the others', error replies are values, a reply
owed too long fails its caller and those behind it, a lost connection fails whoever waits, and the
limiter admits through it on a server with a password and a database of its own, and on a TLS-only
server whose certificate it checks."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ReadOnlyError, ResponseError

from limiter.redis_store import RedisLimiter, _never_sent, user_keys
from limiter.resp import pack_command
from limiter.resp_connection import CLIENT_NAME, RespConnection, open_connection
from tests.limiter.test_redis_url import REDIS_6_SCRIPT_READ_ONLY
from tests.limiter.tiers import tier
from tests.support.ports import free_port
from tests.support.redis_server import RedisServer, start_redis
from tests.support.stalling_proxy import stalling_proxy
from tests.support.tls_files import TlsFiles, make_tls_files

pytestmark = pytest.mark.anyio
PASSWORD = "s3cret-" + secrets.token_hex(4)


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    server = start_redis(extra_args=["--enable-debug-command", "local"])
    yield server
    server.stop()


async def _open(server: RedisServer) -> RespConnection:
    return await open_connection("127.0.0.1", server.port, username=None, password=None, db=0, timeout_s=5)


async def test_many_callers_on_one_connection_each_get_their_own_reply(redis_server: RedisServer) -> None:
    conn = await _open(redis_server)
    try:
        replies = await asyncio.gather(*(conn.send(pack_command("ECHO", f"caller-{i}")) for i in range(500)))
        assert replies == [f"caller-{i}".encode() for i in range(500)]
    finally:
        conn.close()


async def test_a_caller_that_gave_up_does_not_take_the_next_callers_reply(redis_server: RedisServer) -> None:
    conn = await _open(redis_server)
    try:
        stalled = conn.send(pack_command("DEBUG", "SLEEP", "0.2"))  # its reply comes late
        stalled.cancel()  # as a caller's timeout does
        assert await conn.send(pack_command("ECHO", "mine")) == b"mine"
        assert not conn.closed
    finally:
        conn.close()


async def test_error_replies_are_values_and_noscript_is_told_apart(redis_server: RedisServer) -> None:
    conn = await _open(redis_server)
    try:
        missing = await conn.send(pack_command("EVALSHA", "0" * 40, "0"))
        assert isinstance(missing, NoScriptError)
        wrong = await conn.send(pack_command("NOSUCHCOMMAND"))
        assert isinstance(wrong, ResponseError) and not isinstance(wrong, NoScriptError)
        assert await conn.send(pack_command("PING")) == b"PONG"  # the connection goes on
    finally:
        conn.close()


async def test_a_script_refused_read_only_by_a_redis_before_7_is_told_apart(
    redis_server: RedisServer,
) -> None:
    """Redis 6 (ElastiCache 6.x) wraps the READONLY a script meets on a demoted primary in its own
    error: taken for a plain one, the limiter kept the connection and every admit on it failed (the
    local fallback) until the edge restarted. The reply is redis-server 6.2.14's, sent by a script."""
    conn = await _open(redis_server)
    try:
        reply = await conn.send(
            pack_command("EVAL", "return redis.error_reply(ARGV[1])", "0", REDIS_6_SCRIPT_READ_ONLY)
        )
        assert isinstance(reply, ReadOnlyError)
    finally:
        conn.close()


async def test_a_reply_owed_past_the_answer_timeout_fails_it_and_those_behind_it_and_closes(
    redis_server: RedisServer,
) -> None:
    conn = await open_connection(
        "127.0.0.1", redis_server.port, username=None, password=None, db=0, timeout_s=5, answer_timeout_s=0.5
    )
    try:
        # Replies within the timeout keep the connection, however long they take all together.
        for _ in range(3):
            assert await conn.send(pack_command("DEBUG", "SLEEP", "0.2")) == b"OK"
        assert not conn.closed
        late = conn.send(pack_command("DEBUG", "SLEEP", "3"))  # owed past the timeout
        await asyncio.sleep(0)  # written
        behind = conn.send(pack_command("ECHO", "behind"))  # queued behind it on the same connection
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(late, 10)  # (the bound only keeps a broken test from hanging)
        with pytest.raises(TimeoutError):
            await behind  # it went out: it may have run, so no "Error connecting"
        assert conn.closed and not conn.usable()
        assert conn._transport is not None and conn._transport.is_closing()  # the socket too
    finally:
        conn.close()


async def test_a_lost_connection_fails_whoever_waits_and_refuses_new_calls() -> None:
    server = start_redis(extra_args=["--enable-debug-command", "local"])
    try:
        conn = await _open(server)
        waiting = conn.send(pack_command("DEBUG", "SLEEP", "5"))
        await asyncio.sleep(0)  # written
        server.kill()
        # The waiting call went out and may have run: not "Error connecting" (the limiter's
        # _never_sent), so the limiter treats it as unanswered, not as never sent.
        with pytest.raises(RedisConnectionError) as lost:
            await asyncio.wait_for(waiting, 10)
        assert not _never_sent(lost.value)
        assert conn.closed
        with pytest.raises(RedisConnectionError) as refused:
            conn.send(pack_command("PING"))
        assert _never_sent(refused.value)  # nothing was written
    finally:
        server.kill()


async def test_a_command_waiting_for_its_pass_to_end_when_the_connection_goes_was_never_sent(
    redis_server: RedisServer,
) -> None:
    conn = await _open(redis_server)
    try:
        replies = [conn.send(pack_command("ECHO", f"m{i}")) for i in range(20)]  # one pass: two writes
        assert await asyncio.gather(*replies) == [f"m{i}".encode() for i in range(20)]
        sent = conn.send(pack_command("DEBUG", "SLEEP", "0.1"))  # the pass's first: written at once
        unsent = conn.send(pack_command("ECHO", "c"))  # waits for the pass's end
        conn.connection_lost(ConnectionResetError())  # as the transport reports a reset
        with pytest.raises(RedisConnectionError) as lost:
            await sent
        assert not _never_sent(lost.value)  # it went out: it may have run
        with pytest.raises(RedisConnectionError) as never:
            await unsent
        assert _never_sent(never.value)  # it never left this process
    finally:
        conn.close()


async def test_a_refused_connection_is_an_error_connecting() -> None:
    with pytest.raises(RedisConnectionError, match="Error connecting"):
        await open_connection("127.0.0.1", free_port(), username=None, password=None, db=0, timeout_s=5)


async def test_the_limiter_admits_on_a_server_with_a_password_and_a_database_of_its_own() -> None:
    server = start_redis(extra_args=["--requirepass", PASSWORD])
    url = f"redis://:{PASSWORD}@127.0.0.1:{server.port}/3"
    limiter = RedisLimiter.from_url(url, timeout_ms=2000)
    raw = Redis.from_url(url)
    try:
        admitted = await limiter.admit("ann", "req-1", tier(), 10, 10)
        assert admitted.decision.allowed and admitted.lease is not None
        assert not limiter.fallback_active  # Redis answered, not the local fallback
        _, _, slots = user_keys("ann")
        assert await raw.zscore(slots, "req-1") is not None  # in database 3
        assert await admitted.lease.settle() is False
        with pytest.raises(RedisConnectionError, match="Error connecting"):
            await open_connection(
                "127.0.0.1", server.port, username=None, password="wrong", db=0, timeout_s=5
            )
    finally:
        await limiter.aclose()
        await raw.aclose()
        server.kill()


def _admit_connections(server: RedisServer) -> list[dict[str, str]]:
    return [c for c in server.clients() if c["name"] == CLIENT_NAME]


async def test_the_limiter_admits_over_tls_on_its_own_connection(tls_files: TlsFiles) -> None:
    server = start_redis(tls=tls_files)  # no plain port: whatever answers, answered over TLS
    limiter = RedisLimiter.from_url(server.url, timeout_ms=2000)
    try:
        admissions = await asyncio.gather(
            *(
                limiter.admit("tia", f"req-{i}", tier(requests=3, request_window_s=3600), 10, 10)
                for i in range(5)
            )
        )
        assert [a.decision.allowed for a in admissions].count(True) == 3
        assert not limiter.fallback_active
        (admit_connection,) = _admit_connections(server)
        assert admit_connection["cmd"] == "evalsha"
    finally:
        await limiter.aclose()
        server.kill()


async def test_a_server_certificate_from_another_authority_is_refused(
    tls_files: TlsFiles, tmp_path: Path
) -> None:
    server = start_redis(tls=tls_files)
    stranger = make_tls_files(tmp_path)  # the client trusts only this other CA
    limiter = RedisLimiter.from_url(server.url.replace(str(tls_files.ca), str(stranger.ca)), timeout_ms=2000)
    try:
        admitted = await limiter.admit("tom", "req-1", tier(), 10, 10)
        assert admitted.decision.allowed and limiter.fallback_active  # the local fallback answered
        assert _admit_connections(server) == []
    finally:
        await limiter.aclose()
        server.kill()


async def test_a_connection_gone_silent_is_dropped_when_a_call_on_it_times_out() -> None:
    """A peer gone without a reset leaves the connection open and silent; the call on it times out
    (the fallback answers), and the next call opens a new connection rather than waiting on the
    silent one until the kernel gives up on it."""
    server = start_redis()
    try:
        with stalling_proxy(server.port) as proxy:
            limiter = RedisLimiter.from_url(f"redis://127.0.0.1:{proxy.port}/0", timeout_ms=200, backoff_s=0)
            try:
                first = await limiter.admit("sid", "req-1", tier(), 10, 10)
                assert first.decision.allowed and not limiter.fallback_active
                proxy.stall()
                silent = await limiter.admit("sid", "req-2", tier(), 10, 10)
                assert silent.decision.allowed and limiter.fallback_active  # the local fallback answered
                after = await limiter.admit("sid", "req-3", tier(), 10, 10)
                assert after.decision.allowed and not limiter.fallback_active  # Redis answered again
                assert proxy.connections == 2  # on a new connection
            finally:
                await limiter.aclose()
    finally:
        server.kill()


async def test_connect_to_a_redis_that_is_not_there_is_logged_not_raised() -> None:
    limiter = RedisLimiter.from_url(f"redis://127.0.0.1:{free_port()}/0", timeout_ms=200)
    try:
        await limiter.connect()  # the edge starts anyway
        admitted = await limiter.admit("nia", "req-1", tier(), 10, 10)
        assert admitted.decision.allowed and limiter.fallback_active  # the tier's policy answered
    finally:
        await limiter.aclose()


@pytest.mark.parametrize("own_connections", [True, False], ids=["own connection", "redis-py pool"])
async def test_a_batch_meeting_noscript_loads_the_script_and_runs(
    redis_server: RedisServer, own_connections: bool
) -> None:
    """A Redis that lost its scripts (restarted, flushed) answers a settle batch NOSCRIPT: the
    script is loaded and the batch sent again, on either way of sending it."""
    limiter = RedisLimiter.from_url(redis_server.url, timeout_ms=2000, own_connections=own_connections)
    raw = Redis.from_url(redis_server.url)
    user = f"ns-{secrets.token_hex(4)}"
    try:
        admitted = await limiter.admit(user, "req-1", tier(), 10, 10)
        assert admitted.lease is not None
        await raw.script_flush()
        assert await admitted.lease.settle() is False
        assert not limiter.fallback_active  # Redis ran it, not the local fallback
        assert await raw.zscore(user_keys(user)[2], "req-1") is None  # the slot is free on Redis
    finally:
        await limiter.aclose()
        await raw.aclose()
