"""The limiter's RESP packing (hiredis's) writes exactly what redis-py's packer writes, ASCII or not."""

from __future__ import annotations

import pytest
from redis.connection import Connection

from limiter.resp import pack_evalshas

SHA = "a" * 40


def _redis_py(keys: tuple[str, ...], args: tuple[str | int, ...]) -> bytes:
    return b"".join(Connection().pack_command("EVALSHA", SHA, len(keys), *keys, *args))


@pytest.mark.parametrize(
    ("keys", "args"),
    [
        (("fg:{u}:req", "fg:{u}:tok"), ("", "req-1", 100_000, 0, -3)),
        (("fg:{üser}:req",), ("ключ", 7, "", "日本")),  # multi-byte: lengths count bytes
        ((), ()),
    ],
)
def test_packs_what_redis_py_packs(keys: tuple[str, ...], args: tuple[str | int, ...]) -> None:
    assert pack_evalshas(SHA, [(keys, args)]) == _redis_py(keys, args)
    assert pack_evalshas(SHA, [(keys, args), (keys, args)]) == _redis_py(keys, args) * 2
