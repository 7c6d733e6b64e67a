"""Many EVALSHA calls packed into one RESP buffer, for one pipelined write.

redis-py's own packer spends a few microseconds per argument (type checks, an encoder object, a
memoryview path for large values); a limiter decision has sixteen small arguments, so packing
was its largest client-side cost. Arguments here are only str, int and bytes.
"""

from __future__ import annotations

from collections.abc import Sequence

_EVALSHA = b"$7\r\nEVALSHA\r\n"


def _bulk(value: str | int | bytes) -> bytes:
    data = value if isinstance(value, bytes) else str(value).encode()
    return b"$%d\r\n%s\r\n" % (len(data), data)


def pack_evalshas(sha: str, calls: Sequence[tuple[Sequence[str], Sequence[str | int]]]) -> bytes:
    head = _EVALSHA + _bulk(sha)
    out = []
    for keys, args in calls:
        out.append(b"*%d\r\n" % (3 + len(keys) + len(args)))
        out.append(head)
        out.append(_bulk(len(keys)))
        out.extend(_bulk(key) for key in keys)
        out.extend(_bulk(arg) for arg in args)
    return b"".join(out)
