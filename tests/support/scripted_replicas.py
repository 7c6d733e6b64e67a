"""Local engine replicas whose generations a test scripts: the real engine, except for the requests
the test's script takes over (picked by their max_new_tokens, say), for the faults a test stages
(a replica that fails, hangs in its prefill, answers no token or a token with no text). One wrapper
for every such test, passed to `start_server` as its upstreams."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

from edge.config import Settings
from edge.upstreams.base import Delta, GenerationRequest, Upstream
from edge.upstreams.local_pool import PrivateUpstreams, local_upstreams

# The generation of `request` on the real replica `inner`: the script's own, or inner.generate's.
Script = Callable[[Upstream, GenerationRequest], AsyncIterator[Delta]]


class ScriptedReplica:
    generate_direct = None  # the engine's callback path would bypass generate(), and the script

    def __init__(self, inner: Upstream, script: Script) -> None:
        self._inner = inner
        self._script = script
        self.name = inner.name

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def generate(self, req: GenerationRequest) -> AsyncIterator[Delta]:
        return self._script(self._inner, req)


Replicas = Callable[[Settings, Path], AbstractAsyncContextManager[list[Upstream]]]


def wrapped_replicas(wrap: Callable[[Upstream], Upstream]) -> Replicas:
    """`start_server`'s upstreams: the settings' local replicas, each wrapped by `wrap`."""

    def replicas(settings: Settings, model_dir: Path) -> AbstractAsyncContextManager[list[Upstream]]:
        @asynccontextmanager
        async def provide() -> AsyncIterator[list[Upstream]]:
            async with local_upstreams(settings, model_dir) as ups:
                yield PrivateUpstreams([wrap(up) for up in ups])

        return provide()

    return replicas


def scripted_replicas(script: Script) -> Replicas:
    """`start_server`'s upstreams: the settings' local replicas, each scripted by `script`."""
    return wrapped_replicas(lambda up: ScriptedReplica(up, script))
