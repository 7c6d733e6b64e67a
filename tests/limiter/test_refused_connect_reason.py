"""A Redis that refuses the limiter's connection set-up (AUTH, SELECT, CLIENT SETNAME): the warning
the operator reads names the server's reason, and never the password that was refused."""

from __future__ import annotations

import secrets
import socket
import uuid

import pytest
from structlog.testing import capture_logs

from limiter.redis_store import RedisLimiter
from tests.limiter.tiers import tier
from tests.support.redis_server import start_redis

pytestmark = pytest.mark.anyio
PASSWORD = "right-" + secrets.token_hex(4)
WRONG = "wrong-" + secrets.token_hex(4)
# docs/deploy.md's user of its own, less `+client|setname`: an easy line to get wrong.
ACL_WITHOUT_SETNAME = (
    "ACL SETUSER floodgate on >{password} resetkeys ~fg:* ~{{floodgate:* ~floodgate:* resetchannels "
    "&floodgate:* -@all +evalsha +eval +script|load +ping +hello +select +info +time"
)

_FAILURE_LINES = ("limiter_store_failed", "limiter_connect_failed")


@pytest.mark.parametrize(
    ("user", "password", "reason"),
    [("", WRONG, "WRONGPASS"), ("floodgate", PASSWORD, "NOPERM")],
    ids=["wrong-password", "acl-without-client-setname"],
)
async def test_a_refused_set_up_is_logged_with_the_servers_reason(
    user: str, password: str, reason: str
) -> None:
    """redis-py 8 writes a server error's repr as `server:ResponseError`, its message left out, and
    the set-up's refusal was wrapped in its repr: every limiter call on such a Redis logged
    `Error connecting to Redis at HOST:PORT: server:ResponseError`, whether its password was wrong
    or its ACL user lacked a command the limiter sends, and the operator was left to guess."""
    server = start_redis(extra_args=["--requirepass", PASSWORD])
    answer = _as_admin(server.port, ACL_WITHOUT_SETNAME.format(password=PASSWORD))
    assert answer == b"+OK\r\n", answer
    limiter = RedisLimiter.from_url(f"redis://{user}:{password}@127.0.0.1:{server.port}/0", timeout_ms=1000)
    user_name = f"refused-{uuid.uuid4().hex}"
    try:
        with capture_logs() as logs:
            admission = await limiter.admit(user_name, f"{user_name}-1", tier(), 10, 100)
            assert admission.decision.allowed and admission.lease is not None  # the fallback's
            await admission.lease.settle()
        assert limiter.fallback_active
        failed = [line for line in logs if line["event"] in _FAILURE_LINES]
        assert failed, logs
        for line in failed:
            assert reason in line["detail"], line
            assert password not in str(line), line
    finally:
        await limiter.aclose()
        server.kill()


def _as_admin(port: int, command: str) -> bytes:
    """One command after AUTH with the server's password, on a connection of its own."""
    words = command.split()
    request = f"*2\r\n$4\r\nAUTH\r\n${len(PASSWORD)}\r\n{PASSWORD}\r\n"
    request += f"*{len(words)}\r\n" + "".join(f"${len(w)}\r\n{w}\r\n" for w in words)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request.encode())
        reply = b""
        while reply.count(b"\r\n") < 2:
            reply += sock.recv(4096)
    return reply.split(b"\r\n", 1)[1]
