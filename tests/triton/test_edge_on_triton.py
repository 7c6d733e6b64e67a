"""How the edge cancels a Triton stream: the pipeline runs each relay inside the request's anyio
cancel scope (the cancel endpoint and a client hanging up both cancel it), so that scope must catch
its own cancellation whenever it lands. The end-to-end suite itself runs on Triton through
tests/edge/conftest.py (`server` is parametrized over `local` and `triton`)."""

from __future__ import annotations

import asyncio

import anyio
import anyio.lowlevel
import pytest

from edge.cancel.stream_close import aclose_stream
from edge.upstreams.base import GenerationRequest
from edge.upstreams.triton import TritonUpstream, end_token_ids
from gpu_container.triton.trtllm_metrics import TrtLlmMetrics
from tests.triton.conftest import LocalTriton

WAIT_S = 20.0


def _idle(m: TrtLlmMetrics) -> bool:
    return m.active_requests == 0 and m.used_blocks == 0 and m.pending_in_triton == 0


# Each checkpoint lets the stream's set-up go one step further before the cancel lands: while the
# connection opens, once the request is written, and while the first response is awaited.
@pytest.mark.anyio
@pytest.mark.parametrize("checkpoints", [1, 2, 3, 5, 8, 20])
async def test_a_cancel_before_the_stream_is_set_up_stays_inside_its_scope(
    local_triton: LocalTriton, checkpoints: int
) -> None:
    eos = end_token_ids(local_triton.model_dir)[0]
    process = local_triton.process
    upstream = TritonUpstream("triton-test", process.http_url, process.metrics_url, end_id=eos, pad_id=eos)
    try:
        assert await upstream.ready()
        # Long, and past the end tokens: a stream that ends on its own before the cancel lands
        # (a loaded machine can hold this task back that long) leaves the scope nothing to catch.
        request = GenerationRequest(f"cancel-early-{checkpoints}", [11, 42, 7], 2000, seed=1, ignore_eos=True)
        deltas = upstream.generate(request)
        escaped = False
        try:
            with anyio.CancelScope() as scope:
                async with anyio.create_task_group() as tg:

                    async def cancel_once_the_read_waits() -> None:
                        for _ in range(checkpoints):
                            await anyio.lowlevel.checkpoint()
                        scope.cancel()

                    tg.start_soon(cancel_once_the_read_waits)
                    async for _ in deltas:
                        pass
        except asyncio.CancelledError:
            # Nothing else cancels this task: a CancelledError here is the scope's own, let out.
            escaped = True
        finally:
            await aclose_stream(deltas)
        assert not escaped, "the cancel escaped the request's cancel scope"
        assert scope.cancelled_caught
        # The cancelled call reached Triton as a cancel (or never reached it): nothing stays behind.
        metrics = await upstream.metrics()
        with anyio.move_on_after(WAIT_S):
            while not _idle(metrics):
                await anyio.sleep(0.02)
                metrics = await upstream.metrics()
        assert _idle(metrics), f"the replica kept the cancelled request: {metrics}"
    finally:
        await upstream.aclose()
