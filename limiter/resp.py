"""Many EVALSHA calls packed into one RESP buffer, for one pipelined write.

redis-py's own packer spends a few microseconds per argument (type checks, an encoder object, a
memoryview path for large values); a limiter decision has fifteen small arguments, so packing
was its largest client-side cost. Here a call is formatted as one str and encoded once: for ASCII
text (the limiter's keys, ids and integers nearly always are) a character is a byte, so the
lengths written are right; a call with any other character is packed argument by argument.
Arguments are only str and int.
"""

from __future__ import annotations

from collections.abc import Sequence


def _bulk(value: str | int) -> bytes:
    data = str(value).encode()
    return b"$%d\r\n%s\r\n" % (len(data), data)


def _pack_one(head: str, keys: Sequence[str], args: Sequence[str | int]) -> bytes:
    values = [str(v) for v in (*keys, *args)]
    text = f"*{3 + len(values)}\r\n{head}${len(str(len(keys)))}\r\n{len(keys)}\r\n" + "".join(
        [f"${len(v)}\r\n{v}\r\n" for v in values]
    )
    if text.isascii():
        return text.encode()
    count = b"*%d\r\n" % (3 + len(values))
    return count + head.encode() + _bulk(len(keys)) + b"".join([_bulk(v) for v in values])


def pack_evalshas(sha: str, calls: Sequence[tuple[Sequence[str], Sequence[str | int]]]) -> bytes:
    head = f"$7\r\nEVALSHA\r\n${len(sha)}\r\n{sha}\r\n"
    return b"".join([_pack_one(head, keys, args) for keys, args in calls])


def pack_command(*words: str) -> bytes:
    """One command of plain words (AUTH, SELECT) as RESP."""
    return b"*%d\r\n" % len(words) + b"".join([_bulk(w) for w in words])
