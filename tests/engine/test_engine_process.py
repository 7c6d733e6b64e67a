"""EngineProcess: the engine in its own process keeps every promise of the in-thread one.

One child per module (starting one costs an interpreter and the demo model, about a second); the
crash test starts its own, since it kills it.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import shutil
import signal
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import pytest

from gpu_container.contract import (
    Delta,
    GenerationRequest,
    ReplicaRestarting,
    RequestRejected,
    UpstreamError,
)
from gpu_container.engine import engine_process
from gpu_container.engine.async_engine import AsyncEngine
from gpu_container.engine.command_pipe import CommandPipe
from gpu_container.engine.engine import LLMEngine
from gpu_container.engine.engine_process import EngineProcess
from gpu_container.engine.types import EngineConfig, EngineStats
from tests.engine.collector import TIMEOUT_S

pytestmark = pytest.mark.anyio

CONFIG = EngineConfig(block_size=8, num_blocks=64, max_num_seqs=8, max_num_batched_tokens=64)
GREEDY_TOKENS = 24
FOREVER_TOKENS = 400


def greedy(request_id: str, prompt: list[int]) -> GenerationRequest:
    return GenerationRequest(
        request_id, prompt, max_new_tokens=GREEDY_TOKENS, temperature=0.0, ignore_eos=True
    )


def forever(request_id: str, prompt: list[int]) -> GenerationRequest:
    return GenerationRequest(
        request_id, prompt, max_new_tokens=FOREVER_TOKENS, temperature=0.0, ignore_eos=True
    )


@pytest.fixture(scope="module")
def process(demo_dir: Path) -> Iterator[EngineProcess]:
    engine = EngineProcess(demo_dir, CONFIG, "test-engine")
    engine.start()
    yield engine
    engine.stop()


async def _collect(stream: AsyncIterator[Delta]) -> list[Delta]:
    return [output async for output in stream]


async def _stats_until(process: EngineProcess, done: Callable[[EngineStats], bool]) -> EngineStats:
    """Poll the stats the child sends with every step, bounded (no sleep decides the outcome)."""
    async with asyncio.timeout(TIMEOUT_S):
        # The stats come from the child's step messages; there is no event here to wait on.
        while not done(stats := process.stats()):  # noqa: ASYNC110
            await asyncio.sleep(0.01)
    return stats


def test_the_child_starts_with_its_blas_thread_count_set(process: EngineProcess) -> None:
    """Set before numpy loads OpenBLAS, which otherwise starts a thread per core and its buffers
    only for the engine to cap them (the import's CPU halved, engine_process._child_environment)."""
    assert CONFIG.blas_threads > 0 and process.pid is not None
    environ = Path(f"/proc/{process.pid}/environ").read_bytes().split(b"\0")
    for name in (b"OPENBLAS_NUM_THREADS", b"OMP_NUM_THREADS", b"MKL_NUM_THREADS"):
        assert name + b"=" + str(CONFIG.blas_threads).encode() in environ


async def test_deltas_arrive_in_order_and_equal_the_in_thread_engines(
    process: EngineProcess, demo_dir: Path
) -> None:
    prompts = {f"r{i}": [5 + i, 9, 13 + 2 * i, 2] for i in range(4)}
    outputs = await asyncio.gather(
        *(_collect(process.generate(greedy(rid, prompt))) for rid, prompt in prompts.items())
    )
    in_thread = LLMEngine.from_pretrained(demo_dir, CONFIG)
    in_thread.start()
    try:
        expected = await asyncio.gather(
            *(_collect(AsyncEngine(in_thread).generate(greedy(rid, p))) for rid, p in prompts.items())
        )
    finally:
        in_thread.stop()
    for got, want in zip(outputs, expected, strict=True):
        assert [t for o in got for t in o.token_ids] == [t for o in want for t in o.token_ids]
        assert [o.finish_reason for o in got][-1] == "length"
        assert all(o.finish_reason is None for o in got[:-1])


async def test_closing_the_stream_frees_the_sequence(process: EngineProcess) -> None:
    """The abort goes out at close and the child applies it at the top of its next step, as the
    in-thread engine does; how many steps ran meanwhile depends on the pipe's latency, not asserted."""
    before = process.stats().generated_tokens
    stream = process.generate(forever("closed", [3] * 20))
    first = await anext(stream)
    assert first.token_ids and first.finish_reason is None
    await stream.aclose()
    stats = await _stats_until(process, lambda s: s.running == 0 and s.free_blocks == s.num_blocks)
    assert stats.waiting == 0
    assert stats.generated_tokens - before < FOREVER_TOKENS  # cut short, not run to its end


async def test_a_request_the_engine_refuses_raises_and_the_engine_serves_on(process: EngineProcess) -> None:
    with pytest.raises(RequestRejected, match="empty"):
        await anext(process.generate(greedy("empty", [])))
    with pytest.raises(RequestRejected, match="outside"):
        await anext(process.generate(greedy("huge-id", [10**9])))
    outputs = await _collect(process.generate(greedy("after", [4, 5])))
    assert sum(len(o.token_ids) for o in outputs) == GREEDY_TOKENS
    assert process.running


async def test_a_crashed_engine_process_fails_its_streams_instead_of_hanging(demo_dir: Path) -> None:
    doomed = EngineProcess(demo_dir, CONFIG, "doomed")
    doomed.start()
    try:
        stream = doomed.generate(forever("victim", [7, 8, 9]))
        await anext(stream)
        assert doomed.pid is not None
        os.kill(doomed.pid, signal.SIGKILL)
        async with asyncio.timeout(TIMEOUT_S):
            # Saying the replica is coming back, and about when: the edge's request waits for it.
            with pytest.raises(ReplicaRestarting, match="exited unexpectedly") as failed:
                await _collect(stream)
        assert failed.value.back_in_s >= 0.0
        # The first child's crash is forgiven: the request is sent back once.
        assert not failed.value.may_be_cause
    finally:
        doomed.stop()


async def test_a_crashed_engine_process_comes_back_and_serves(demo_dir: Path) -> None:
    """The replica does not stay dead (the edge would answer 503 forever): a new child takes over."""
    crashing = EngineProcess(demo_dir, CONFIG, "crashing")
    crashing.start()
    try:
        first_pid = crashing.pid
        assert first_pid is not None
        assert crashing.back_in_s() is None  # serving
        os.kill(first_pid, signal.SIGKILL)
        async with asyncio.timeout(TIMEOUT_S):
            # The restart runs on the reader thread; nothing here to wait on but its effect (the
            # count goes up just after the new child runs: read together, beside a loaded machine's
            # other tests, the pid was new and the count still 0).
            while not (crashing.running and crashing.restarts):  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        assert crashing.restarts == 1 and crashing.pid != first_pid
        assert crashing.back_in_s() is None  # serving again
        outputs = await _collect(crashing.generate(greedy("after-restart", [4, 5])))
        assert sum(len(o.token_ids) for o in outputs) == GREEDY_TOKENS
        assert outputs[-1].finish_reason == "length"

        # A crash of the new child within a minute of its start is not forgiven: the request on it
        # may be what kills every child it is sent to.
        stream = crashing.generate(forever("second-victim", [7, 8, 9]))
        await anext(stream)
        assert crashing.pid is not None
        os.kill(crashing.pid, signal.SIGKILL)
        async with asyncio.timeout(TIMEOUT_S):
            with pytest.raises(ReplicaRestarting) as failed:
                await _collect(stream)
        assert failed.value.may_be_cause
    finally:
        crashing.stop()
    assert not crashing.running
    assert _live_pid(crashing.pid) is False


async def test_an_engine_whose_stall_timeout_is_weeks_serves(demo_dir: Path) -> None:
    """[engine] stall_timeout_s set past what poll(2) takes (about 24.8 days, as an operator who
    wants the watch all but off might set it): the reader's wait for the child's messages raised
    OverflowError, its thread ended at once, and every request on the replica, ready to every
    health check, hung for good."""
    patient = EngineProcess(demo_dir, CONFIG, "patient", stall_timeout_s=1e7)
    patient.start()
    try:
        async with asyncio.timeout(TIMEOUT_S):
            outputs = await _collect(patient.generate(greedy("patient", [4, 5])))
        assert sum(len(o.token_ids) for o in outputs) == GREEDY_TOKENS
    finally:
        patient.stop()


async def test_stop_during_a_restart_ends_it(demo_dir: Path) -> None:
    restarting = EngineProcess(demo_dir, CONFIG, "restarting")
    restarting.start()
    first_pid = restarting.pid
    assert first_pid is not None
    os.kill(first_pid, signal.SIGKILL)
    await asyncio.to_thread(restarting.stop)
    assert not restarting.running
    # Whichever child stop() met (the dead one, or a new one loading), none is left, and none
    # starts later.
    assert _live_pid(restarting.pid) is False
    assert restarting.restarts == 0


def _live_pid(pid: int | None) -> bool:
    """Whether `pid` names a process (stop() reaps its child, so a stopped one's is gone)."""
    assert pid is not None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_stop_cancels_open_streams(demo_dir: Path) -> None:
    stopping = EngineProcess(demo_dir, CONFIG, "stopping")
    stopping.start()
    stream = stopping.generate(forever("open", [7, 8, 9]))
    await anext(stream)
    await asyncio.to_thread(stopping.stop)
    async with asyncio.timeout(TIMEOUT_S):
        rest = await _collect(stream)
    assert rest[-1].finish_reason == "cancelled"
    assert not stopping.running


async def test_a_sigterm_to_the_process_group_leaves_the_engine_to_its_parent(process: EngineProcess) -> None:
    """systemd and `timeout` signal the whole group: the edge's drain, not the signal, ends the engine."""
    stream = process.generate(greedy("through-sigterm", [7, 8, 9]))
    first = await anext(stream)
    assert process.pid is not None
    os.kill(process.pid, signal.SIGTERM)
    async with asyncio.timeout(TIMEOUT_S):
        rest = await _collect(stream)
    outputs = [first, *rest]
    assert outputs[-1].finish_reason == "length"
    assert sum(len(o.token_ids) for o in outputs) == GREEDY_TOKENS
    assert process.running


def test_the_engine_process_logs_json_lines(demo_dir: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """One log format for the operator: the child's lines are JSON, as the edge's are."""
    logged = EngineProcess(demo_dir, CONFIG, "logging")
    logged.start()
    logged.stop()
    lines = [line for line in capfd.readouterr().out.splitlines() if "engine started" in line]
    assert lines, "the engine process logged no start line"
    assert json.loads(lines[0])["event"] == "engine started"


async def test_a_prompt_found_in_the_prefix_cache_reports_it_on_its_first_delta(
    process: EngineProcess,
) -> None:
    """The cached-token figure crosses the wire: the full blocks the two prompts share, once."""
    shared = list(range(40, 60))  # 20 tokens: two full blocks of 8, then 4 more
    cold = await _collect(process.generate(greedy("cold", [*shared, 70, 71, 72, 73])))
    warm = await _collect(process.generate(greedy("warm", [*shared, 80, 81, 82, 83])))
    assert sum(d.cached_tokens for d in cold) == 0
    assert warm[0].cached_tokens == 2 * CONFIG.block_size
    assert all(d.cached_tokens == 0 for d in warm[1:])


async def test_every_delivery_of_a_step_runs_inside_the_edges_run_delivery(
    demo_dir: Path,
) -> None:
    """The edge hands the process a wrapper for each step's delivery (it holds the step's writes,
    edge/writes_together.py): every token offered to a stream is offered inside it, and every stream
    gets the tokens a process without it gives."""
    inside = False

    def run_delivery(deliver: Callable[[Any], None], items: Any) -> None:
        nonlocal inside
        inside = True
        try:
            deliver(items)
        finally:
            inside = False

    offered_inside: list[bool] = []
    offered: dict[str, list[int]] = {}

    def offer_to(rid: str) -> Callable[[Delta], bool]:
        def offer(delta: Delta) -> bool:
            offered_inside.append(inside)
            offered.setdefault(rid, []).extend(delta.token_ids)
            return True

        return offer

    prompts = {f"w{i}": [7 + i, 8, 9] for i in range(3)}
    wrapped = EngineProcess(demo_dir, CONFIG, "wrapped", run_delivery=run_delivery)
    wrapped.start()
    try:
        direct = await asyncio.gather(
            *(_collect(wrapped.generate_direct(greedy(rid, p), offer_to(rid))) for rid, p in prompts.items())
        )
        plain = [await _collect(wrapped.generate(greedy(f"plain-{rid}", p))) for rid, p in prompts.items()]
    finally:
        wrapped.stop()
    assert offered_inside and all(offered_inside)
    for rid, taken, want in zip(prompts, direct, plain, strict=True):
        # (An output that came while its stream was not waiting was taken instead of offered.)
        got = offered.get(rid, []) + [t for o in taken for t in o.token_ids]
        assert sorted(got) == sorted(t for o in want for t in o.token_ids)


async def test_a_child_that_cannot_start_again_leaves_the_replica_down_and_stop_still_ends_it(
    demo_dir: Path, tmp_path: Path
) -> None:
    model = tmp_path / "model"
    shutil.copytree(demo_dir, model)
    broken = EngineProcess(model, CONFIG, "broken")
    broken.start()
    first_pid = broken.pid
    assert first_pid is not None
    shutil.rmtree(model)
    os.kill(first_pid, signal.SIGKILL)
    async with asyncio.timeout(TIMEOUT_S):
        # Coming back until a new child was tried and failed to load the model: nothing to wait on
        # but its effect.
        while broken.pid == first_pid or broken.back_in_s() is not None:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
    # Down for a reason a restart did not mend: a request fails at once as on any dead replica,
    # not as coming back.
    assert not broken.running
    with pytest.raises(UpstreamError, match="not running"):
        await anext(broken.generate(greedy("while-down", [1, 2])))
    await asyncio.to_thread(broken.stop)
    assert broken.restarts == 0
    assert _live_pid(broken.pid) is False


def _exhaust_file_descriptors() -> tuple[list[int], tuple[int, int]]:
    """Leave this process no free file descriptor (as an edge at its open-files limit under a
    flood of connections): the soft limit just past the highest in use, every hole below it filled.
    Returns the fillers and the limit to restore."""
    limit = resource.getrlimit(resource.RLIMIT_NOFILE)
    highest = max(int(fd) for fd in os.listdir("/proc/self/fd"))
    resource.setrlimit(resource.RLIMIT_NOFILE, (highest + 1, limit[1]))
    fillers: list[int] = []
    try:
        while True:
            fillers.append(os.open(os.devnull, os.O_RDONLY))
    except OSError:
        pass
    return fillers, limit


def _release_file_descriptors(fillers: list[int], limit: tuple[int, int]) -> None:
    for fd in fillers:
        os.close(fd)
    resource.setrlimit(resource.RLIMIT_NOFILE, limit)


async def test_a_restart_that_cannot_even_spawn_the_child_is_tried_again(demo_dir: Path) -> None:
    """A child that dies while the edge has no file descriptor left (or its interpreter is gone):
    the new child cannot be spawned at all. The restart is tried again, as after a child that
    failed to load, and the replica comes back once descriptors are free; before, the OSError
    ended the reader thread, and the replica stayed "back in 0 s" for good: requests waited for
    it until their own timeouts and no child was ever started again."""
    starved = EngineProcess(demo_dir, CONFIG, "starved")
    starved.start()
    try:
        first_pid = starved.pid
        assert first_pid is not None and starved._reader is not None
        fillers, limit = _exhaust_file_descriptors()
        try:
            os.kill(first_pid, signal.SIGKILL)
            async with asyncio.timeout(TIMEOUT_S):
                # The reader's spawn fails for want of a descriptor: nothing to wait on but its effect
                # (seen dead, then no longer expected back; before, the reader gone).
                while starved.running or (  # noqa: ASYNC110
                    starved.back_in_s() is not None and starved._reader.is_alive()
                ):
                    await asyncio.sleep(0.01)
            assert not starved.running
        finally:
            _release_file_descriptors(fillers, limit)
        async with asyncio.timeout(TIMEOUT_S):
            while not (starved.running and starved.restarts):  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        outputs = await _collect(starved.generate(greedy("after-starving", [4, 5])))
        assert sum(len(o.token_ids) for o in outputs) == GREEDY_TOKENS
    finally:
        await asyncio.to_thread(starved.stop)
    assert _live_pid(starved.pid) is False


async def test_a_stuck_child_that_outlives_its_kill_still_fails_its_streams_and_is_replaced(
    demo_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stuck child is often stuck in the kernel (a hung read of its model's file, a driver), where
    SIGKILL lands only once that returns. Its kill, not reaped within _STOP_TIMEOUT_S, raised
    TimeoutExpired in the reader thread, which ended: the stream on it hung for good, the replica
    stayed ready to every health check, and no child ever replaced it. Here the timeout is cut to
    nothing, so that no kill is reaped within it."""
    hung = EngineProcess(demo_dir, CONFIG, "hung", stall_timeout_s=0.5)
    hung.start()
    monkeypatch.setattr(engine_process, "_STOP_TIMEOUT_S", 1e-9)
    try:
        stream = hung.generate(forever("on-hung", [7, 8, 9]))
        await anext(stream)
        first_pid = hung.pid
        assert first_pid is not None
        os.kill(first_pid, signal.SIGSTOP)
        async with asyncio.timeout(TIMEOUT_S):
            with pytest.raises(ReplicaRestarting):
                await _collect(stream)
            while not (hung.running and hung.restarts):  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        assert hung.pid != first_pid
        outputs = await _collect(hung.generate(greedy("after-hung", [4, 5])))
        assert sum(len(o.token_ids) for o in outputs) == GREEDY_TOKENS
    finally:
        monkeypatch.undo()
        await asyncio.to_thread(hung.stop)


async def test_a_stopped_child_never_blocks_the_loop_that_writes_to_it(demo_dir: Path) -> None:
    """A child alive but not reading (stopped here; a step that never returns, a deadlock) let its
    command pipe fill (64 KiB), and the next "add" or "abort" blocked the edge's event loop itself:
    every stream of every user, the health checks and the metrics froze until the stall watch killed
    the child. The writes come from a loop of their own here, in a thread, so that the test fails
    where they block rather than hanging with them; once the child runs again it reads them all and
    serves."""
    stopped = EngineProcess(demo_dir, CONFIG, "not-reading")
    stopped.start()
    pid = stopped.pid
    assert pid is not None
    # Some 30 KB of pickle each (tokens past 255 take 3 bytes): an "add" and, as each stream closes,
    # an "abort" for 32 of them are 1 MB, many times the pipe's buffer. Too long for the model, they
    # are refused once the child reads them.
    long_prompt = [1000] * 10_000

    async def submit_and_close() -> None:
        streams = [stopped.generate(greedy(f"long-{i}", long_prompt)) for i in range(32)]
        tasks = [asyncio.create_task(anext(stream)) for stream in streams]
        await asyncio.sleep(0)  # one pass of the loop: each task's first step submits its request
        for task in tasks:
            task.cancel()  # its stream's close sends "abort"
        await asyncio.gather(*tasks, return_exceptions=True)

    writer = threading.Thread(target=asyncio.run, args=(submit_and_close(),), daemon=True)
    os.kill(pid, signal.SIGSTOP)
    try:
        writer.start()
        await asyncio.to_thread(writer.join, TIMEOUT_S)
        blocked = writer.is_alive()
    finally:
        os.kill(pid, signal.SIGCONT)  # and a blocked writer's write goes through
    try:
        assert not blocked, "a write to a child that does not read blocked its caller's event loop"
        async with asyncio.timeout(TIMEOUT_S):
            outputs = await _collect(stopped.generate(greedy("after-stopped", [4, 5])))
        assert sum(len(o.token_ids) for o in outputs) == GREEDY_TOKENS
        assert stopped.pid == pid and stopped.restarts == 0
    finally:
        await asyncio.to_thread(writer.join, TIMEOUT_S)
        await asyncio.to_thread(stopped.stop)


def test_commands_the_child_did_not_read_yet_keep_their_order() -> None:
    """What the pipe does not take waits in a backlog, and every message after it too: an "abort"
    never overtakes its "add"."""
    read_end, write_end = os.pipe()
    pipe = CommandPipe(write_end, "ordered")
    reader = Connection(read_end, writable=False)
    try:
        messages = [("add", f"r{i}", [1000 + i] * 5_000) for i in range(64)]  # 15 KB each
        for message in messages:
            pipe.send(message)  # returns, though nothing reads yet
            pipe.send(("abort", message[1]))
        assert pipe.backlog > 0
        got = [reader.recv() for _ in range(2 * len(messages))]
        assert got == [m for message in messages for m in (message, ("abort", message[1]))]
    finally:
        pipe.close()
        reader.close()


def test_commands_to_a_child_that_is_gone_are_dropped() -> None:
    read_end, write_end = os.pipe()
    pipe = CommandPipe(write_end, "orphaned")
    os.close(read_end)
    pipe.send(("abort", "r0"))  # EPIPE: the reader thread, not the writer, notices the death
    assert pipe.backlog == 0
    pipe.close()


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def test_stop_closes_the_pipes_to_its_children(demo_dir: Path) -> None:
    """The reader thread ended without closing the last child's pipes: two descriptors left open for
    each EngineProcess stopped (the edge's replicas, a test suite's hundreds) until garbage
    collection."""
    before = _open_fds()
    closing = EngineProcess(demo_dir, CONFIG, "closing")
    closing.start()
    first_pid = closing.pid
    assert first_pid is not None
    os.kill(first_pid, signal.SIGKILL)
    try:
        async with asyncio.timeout(TIMEOUT_S):
            while not (closing.running and closing.restarts):  # noqa: ASYNC110
                await asyncio.sleep(0.01)
    finally:
        await asyncio.to_thread(closing.stop)
    assert _open_fds() == before


async def test_a_start_that_fails_closes_the_pipes_to_its_child(tmp_path: Path) -> None:
    before = _open_fds()
    broken = EngineProcess(tmp_path / "no-model", CONFIG, "never-started")
    with pytest.raises(RuntimeError, match="failed to start"):
        await asyncio.to_thread(broken.start)
    broken.stop()
    assert _open_fds() == before
