"""Which error replies say that their server is a replica (READONLY), however a Redis version
words them.

A standalone primary failed over behind its endpoint's name (ElastiCache without cluster mode,
Sentinel) keeps the connections opened before, demoted to a replica: a READONLY reply is how a
client learns it must connect again (limiter/redis_url.py, limiter/direct_calls.py). Redis 7 keeps
a script's error code (`READONLY You can't write against a read only replica.`), but Redis 6 and
older (ElastiCache 6.x, still common) wrap every error a script meets in its own:
`ERR Error running script (call to f_…): @user_script:1: @user_script: 1: -READONLY You can't…`.
Read as a plain error, it never closed the connection: every script on it (the limiter's, the
cancel bus's, publishes, fleet beats) failed until the edge restarted.
"""

from __future__ import annotations

from redis._parsers import _AsyncHiredisParser, _AsyncRESP2Parser
from redis.exceptions import ReadOnlyError, ResponseError
from redis.utils import HIREDIS_AVAILABLE

_SCRIPT_ERROR = "ERR Error running script"
_WRAPPED_READ_ONLY = ": -READONLY "


def script_read_only(message: str) -> bool:
    """Whether the error reply `message` (its text, code first) is a Redis before 7's script error
    wrapping a READONLY (a bare one starts with its code: READONLY)."""
    return message.startswith(_SCRIPT_ERROR) and _WRAPPED_READ_ONLY in message


def _read_only_in_script(message: str) -> ResponseError | None:
    # redis-py types a bare READONLY itself; only the wrapped one is left.
    return ReadOnlyError(message) if script_read_only(message) else None


class _HiredisParser(_AsyncHiredisParser):
    @classmethod
    def parse_error(cls, response: str) -> ResponseError:
        return _read_only_in_script(response) or super().parse_error(response)  # type: ignore[no-untyped-call]


class _Resp2Parser(_AsyncRESP2Parser):
    @classmethod
    def parse_error(cls, response: str) -> ResponseError:
        return _read_only_in_script(response) or super().parse_error(response)  # type: ignore[no-untyped-call]


# redis-py's parser (the C one where hiredis loads, as it does by default), but a script's READONLY
# from a Redis before 7 typed ReadOnlyError too. RESP2: what redis-py speaks unless told otherwise.
ReadOnlyAwareParser: type[_AsyncHiredisParser | _AsyncRESP2Parser] = (
    _HiredisParser if HIREDIS_AVAILABLE else _Resp2Parser
)
