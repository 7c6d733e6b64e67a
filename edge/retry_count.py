"""Whether a request is a client's retry of one it sent before: `x-stainless-retry-count`.

The OpenAI SDKs (and the Anthropic ones, all Stainless-generated) send it on every request, 0 on
the first try and the retries taken so far on each retry; this project's client sends it alike
(client/floodgate_client/client.py). The scaling signal reads it (edge/scaling/demand.py): a retry
of a request the admission queue refused asks for work that was counted at its first try. With no
GPU replica up, every request is refused no_replica and the clients retry it as told, so each
client counted once per try: 6 OpenAI SDK clients at their default two retries published the
demand of 18 requests, and a client retrying for the minutes a first host boots counted once a
second.

Neither SDK sends an idempotency key (the OpenAI SDK defines none), and a request refused on one
edge is retried on whichever edge the load balancer picks, so the edge cannot tie a retry to the
try it repeats: the count is all it is told. A client that sends none (curl in a loop) is counted
on every try.
"""

from __future__ import annotations

from litestar.types import Scope

RETRY_COUNT_HEADER = b"x-stainless-retry-count"


def is_retry(scope: Scope) -> bool:
    """The request says it is a retry: a retry count of 1 or more (an unreadable one: not).

    Read as digits, never converted: int() refuses a string of more than 4,300 digits (a
    ValueError), and any key holder's request sending one answered 500, with an `unhandled_error`
    line and a 500 counted, the signals of the server's own faults."""
    for name, value in scope["headers"]:
        if name == RETRY_COUNT_HEADER:
            count = value.strip()
            return count.isdigit() and count.strip(b"0") != b""
    return False
