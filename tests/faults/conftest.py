"""Fixtures of the fault tests shared with other areas."""

from collections.abc import Iterator

import pytest

from tests.support.admitted import admitter  # noqa: F401  (requests admitted on a real Redis)
from tests.support.redis_server import start_redis


@pytest.fixture(params=["memory", "redis"])
def limiter_settings(request: pytest.FixtureRequest) -> Iterator[dict[str, str]]:
    """The [limiter] settings of each backend: the in-process twin, and a real Redis of the test's own."""
    if request.param == "memory":
        yield {"backend": "memory"}
        return
    redis = start_redis()
    try:
        yield {"backend": "redis", "redis_url": redis.url}
    finally:
        redis.kill()
