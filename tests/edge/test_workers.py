"""`floodgate serve --workers N`: one port, N edge processes, limits exact across them."""

from __future__ import annotations

import collections
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from edge.config import load_settings
from edge.workers import StopSignals, WorkersRefused, plan_workers, worker_overrides
from tests.edge.sse_client import CHAT, MODEL
from tests.support.live_server import demo_model_dir
from tests.support.ports import free_consecutive_ports, free_port
from tests.support.redis_server import RedisServer, start_redis
from tests.support.triton_server import LocalTriton

ALLOWED = 12
ASKED = 20
STREAMS = 8
ENGINE_SEQUENCES = 4


def test_each_worker_is_one_more_edge_instance() -> None:
    settings = load_settings(
        None, {"limiter": {"backend": "redis", "instance_count": 3}, "server": {"port": 8000}}
    )
    first, second = (worker_overrides(settings, 2, i) for i in range(2))
    # 3 hosts × 2 workers: each worker enforces and fills 1/6, as one of 6 instances.
    assert first["limiter"]["instance_count"] == second["limiter"]["instance_count"] == 6
    ops = settings.server.ops_port
    assert (first["server"]["ops_port"], second["server"]["ops_port"]) == (ops, ops + 1)


def test_workers_refuse_a_limiter_each_would_keep_alone() -> None:
    settings = load_settings(None, {"limiter": {"backend": "memory"}, "server": {"port": 8000}})
    with pytest.raises(WorkersRefused, match='backend = "redis"'):
        worker_overrides(settings, 2, 0)
    assert worker_overrides(settings, 1, 0)["limiter"]["instance_count"] == settings.limiter.instance_count


def test_each_worker_gets_as_many_sigterms_as_the_parent_was_sent() -> None:
    """A worker takes its second SIGTERM as a cut. After one worker's own exit the parent has the
    others drain (one SIGTERM each); a supervisor's SIGTERM then, its first, was passed on as
    their second and cut the streams they were draining (a review: `drain_deadline_cut`, the
    stream ended `server_shutting_down`). Only a second one from the supervisor cuts."""
    stops = StopSignals()
    assert stops.worker_exited()  # the others drain
    assert not stops.asked
    assert not stops.received(signal.SIGTERM)  # the supervisor's first: they drain already
    assert stops.asked
    assert stops.received(signal.SIGTERM)  # its second: a cut, as asked
    assert stops.received(signal.SIGINT)  # Ctrl-C is passed on as it comes

    plain = StopSignals()
    assert plain.received(signal.SIGTERM)  # the usual stop: each worker drains
    assert not plain.worker_exited()  # one then exiting adds no second SIGTERM
    assert plain.received(signal.SIGTERM)


def test_workers_refuse_a_port_another_process_listens_on() -> None:
    """Each worker binds the port with SO_REUSEPORT, which any process of the same account that
    bound it so too shares without a word: a second `serve --workers 2` on the port a first one's
    workers serve started, and the kernel split the connections between the two edges (an old
    config, an old version). A lone `serve` is refused there (Address already in use)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as other:
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)  # as another edge's worker
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        # The operator ports free ones too: the defaults (9464, 9465) are any local exporter's.
        server = {"host": "127.0.0.1", "port": port, "ops_port": free_consecutive_ports(2)}
        settings = load_settings(None, {"limiter": {"backend": "redis"}, "server": server})
        with pytest.raises(
            SystemExit, match=rf"cannot listen on 127\.0\.0\.1:{port}: Address already in use"
        ):
            plan_workers({}, settings, 2)
    # Free again: the workers may bind it, each with SO_REUSEPORT (the check holds nothing).
    assert len(plan_workers({}, settings, 2)) == 2


@pytest.fixture
def redis() -> Iterator[RedisServer]:
    server = start_redis()
    try:
        yield server
    finally:
        server.stop()


def _serve_two_workers(
    tmp_path: Path,
    redis: RedisServer,
    port: int,
    ops_port: int,
    *,
    paid: str = f"requests_per_window = {ALLOWED}\nrequest_window_s = 3600\n",
    more: str = "",
    heartbeat_s: float = 0.25,
) -> list[str]:
    """`floodgate serve --workers 2` on the demo model and this Redis; worker i's operator
    listener on ops_port + i. `paid`: the paid tier's lines; `more`: further sections."""
    config = tmp_path / "floodgate.toml"
    config.write_text(
        f'[model]\nsource = "demo"\nname = "{MODEL}"\ndemo_dir = "{demo_model_dir()}"\n'
        f'[messages]\nsqlite_path = "{tmp_path / "messages.db"}"\n'
        f'[server]\nkeys_file = "{tmp_path / "keys.jsonl"}"\nops_port = {ops_port}\ndrain_accept_s = 0\n'
        f'[limiter]\nbackend = "redis"\nredis_url = "{redis.url}"\n'
        # Each worker is a fleet member (edge/membership/); the second joins after two beats.
        f"[fleet]\nheartbeat_s = {heartbeat_s}\nmember_ttl_s = {4 * heartbeat_s}\n"
        f"[tiers.paid]\n{paid}{more}"
    )
    command = [sys.executable, "-m", "edge.cli", "serve", "--config", str(config), "--port", str(port)]
    return [*command, "--workers", "2"]


@pytest.mark.server  # runs `floodgate serve --workers 2` itself, through subprocess
def test_a_worker_that_cannot_start_ends_serve_with_its_own_exit_code(
    tmp_path: Path, redis: RedisServer
) -> None:
    ops_port = free_consecutive_ports(2)
    command = _serve_two_workers(tmp_path, redis, free_port(), ops_port)
    proc = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
            # The second worker's operator port is someone else's: it cannot start. Taken once serve
            # has checked its ports (a port taken before is refused by serve itself, test_cli.py):
            # the dev key's hint comes after that check, before the workers are spawned.
            assert proc.stdout is not None
            for line in proc.stdout:
                if "curl" in line:
                    break
            taken.bind(("127.0.0.1", ops_port + 1))
            taken.listen()
            stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=60)
    # Its own code and its own words, not the SIGTERM that stopped the other worker (-15: 241).
    assert proc.returncode == 1, stdout[-2000:] + stderr[-2000:]
    assert f"127.0.0.1:{ops_port + 1} (ops_port): Address already in use" in stderr
    assert "floodgate-worker-1 exited on its own (code 1)" in stderr


@pytest.mark.server  # runs `floodgate serve --workers 2` itself, through subprocess
def test_two_workers_share_one_request_limit_exactly(tmp_path: Path, redis: RedisServer) -> None:
    # Both workers' operator ports free: another test's server on ops_port + 1 would stop the second.
    port, ops_port = free_port(), free_consecutive_ports(2)
    command = _serve_two_workers(tmp_path, redis, port, ops_port)
    proc = subprocess.Popen(
        command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        headers = _dev_key_headers(proc)
        for worker_ops in (ops_port, ops_port + 1):
            _wait_answering(f"http://127.0.0.1:{worker_ops}/readyz", proc)  # joined: it has its share
        body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}
        statuses = []
        for _ in range(ASKED):
            # A new connection each time: the kernel picks a worker per connection.
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
                statuses.append(client.post(CHAT, json=body, headers=headers).status_code)
        assert sorted(statuses) == [200] * ALLOWED + [429] * (ASKED - ALLOWED)
        served = [
            _finished(f"http://127.0.0.1:{worker_ops}/metrics") for worker_ops in (ops_port, ops_port + 1)
        ]
        assert sum(served) == ALLOWED and all(served), served  # both workers took some
    finally:
        proc.terminate()
        output, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, output[-2000:]
    # One standard output for both: each request's line says which worker served or refused it.
    records = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
    completed = collections.Counter(r.get("worker") for r in records if r["event"] == "chat_completion")
    assert [completed[0], completed[1]] == served, records
    refused = [r.get("worker") for r in records if r["event"] == "chat_refused"]
    assert len(refused) == ASKED - ALLOWED and set(refused) <= {0, 1}, records


def _dev_key_headers(proc: subprocess.Popen[str]) -> dict[str, str]:
    """The dev key `serve` prints on its second line, as a request's headers."""
    assert proc.stdout is not None
    lines = [proc.stdout.readline() for _ in range(2)]
    key_match = re.search(r"(fg-\S+)", lines[1])
    assert key_match, lines
    return {"Authorization": f"Bearer {key_match.group(1)}"}


@pytest.mark.server  # runs `floodgate serve --workers 2` itself, through subprocess
def test_each_worker_fills_the_whole_of_its_own_engine(tmp_path: Path, redis: RedisServer) -> None:
    """With the local engine each worker starts one of its own: a replica no other worker sends
    work to, which the fleet's share must not divide. 8 long streams over 2 workers whose engines
    hold 4 sequences each: a worker queues a stream only when its own engine is full (all 8 run
    when the kernel splits them 4 and 4). Each filled its fleet share, half: 2 of its 4 sequences,
    the other streams queued behind them."""
    port, ops_port = free_port(), free_consecutive_ports(2)
    more = f"[engine]\nmax_num_seqs = {ENGINE_SEQUENCES}\n"
    command = _serve_two_workers(tmp_path, redis, port, ops_port, paid="max_concurrent = 16\n", more=more)
    proc = subprocess.Popen(
        command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    stop = threading.Event()
    try:
        headers = _dev_key_headers(proc)
        for worker_ops in (ops_port, ops_port + 1):
            _wait_answering(f"http://127.0.0.1:{worker_ops}/readyz", proc)
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 2000,
            "ignore_eos": True,
            "stream": True,
        }

        def stream() -> int:
            # A connection of its own: the kernel picks a worker per connection.
            with (
                httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as client,
                client.stream("POST", CHAT, json=body, headers=headers) as response,
            ):
                for _ in response.iter_lines():
                    if stop.is_set():
                        break  # hanging up cancels the stream
                return response.status_code

        with ThreadPoolExecutor(STREAMS) as pool:
            streams = [pool.submit(stream) for _ in range(STREAMS)]
            seen: list[tuple[int, int]] = []  # (held, queued) per worker, once all 8 had arrived

            def each_engine_full_before_any_queues() -> bool:
                nonlocal seen
                now = [_held_and_queued(worker_ops) for worker_ops in (ops_port, ops_port + 1)]
                if sum(held + queued for held, queued in now) != STREAMS:
                    return False
                seen = now
                return all(held == min(held + queued, ENGINE_SEQUENCES) for held, queued in now)

            try:
                _wait_until(each_engine_full_before_any_queues, lambda: f"(held, queued) per worker: {seen}")
            finally:
                stop.set()
            assert [s.result() for s in streams] == [200] * STREAMS
    finally:
        stop.set()
        proc.terminate()
        output, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, output[-2000:]


@pytest.mark.server  # runs `floodgate serve --workers 2` itself, through subprocess
def test_a_joining_worker_takes_no_connection_on_the_shared_port(
    tmp_path: Path, redis: RedisServer, local_triton: LocalTriton
) -> None:
    """Workers on a Triton host they all reach: the second to join the fleet has a share of 0 until
    the first made room (two beats, edge/membership/), and one port has no readiness check a load
    balancer could route by. So it listens on the port only once it has its share: from the
    moment the port accepts, every request is served, by either worker. It listened at once and
    answered 503 no_replica to whatever the kernel gave it for those two beats."""
    port, ops_port = free_port(), free_consecutive_ports(2)
    more = f'[upstream]\ntriton = "{local_triton.spec}"\n'
    command = _serve_two_workers(
        tmp_path, redis, port, ops_port, paid="max_concurrent = 16\n", more=more, heartbeat_s=1.0
    )
    proc = subprocess.Popen(
        command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        headers = _dev_key_headers(proc)
        body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}
        answers: list[str] = []  # from the first connection the port accepted

        def both_served() -> bool:
            """One request after another, each on a new connection (the kernel picks a worker per
            connection), until both workers have finished some."""
            try:
                with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
                    answer = client.post(CHAT, json=body, headers=headers)
            except httpx.ConnectError:
                if answers:
                    answers.append("connection refused")
                return False
            error = answer.json().get("error", {}).get("code", "") if answer.status_code != 200 else ""
            answers.append(f"{answer.status_code} {error}".strip())
            try:
                return all(_finished(f"http://127.0.0.1:{o}/metrics") for o in (ops_port, ops_port + 1))
            except httpx.TransportError:
                return False  # that worker's operator listener is not up yet

        _wait_until(both_served, lambda: f"answers {collections.Counter(answers)}")
        assert set(answers) == {"200"}, collections.Counter(answers)
    finally:
        proc.terminate()
        output, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, output[-2000:]


def _held_and_queued(ops_port: int) -> tuple[int, int]:
    """A worker's sequences on its engine, as its dispatcher counts them, and its queued requests."""
    base = f"http://127.0.0.1:{ops_port}"
    (replica,) = httpx.get(f"{base}/v1/internal/engine", timeout=10).json()["replicas"]
    text = httpx.get(f"{base}/metrics", timeout=10).text
    queued = sum(
        int(float(m.group(1))) for m in re.finditer(r"^floodgate_queue_depth\{[^}]*\} (\S+)$", text, re.M)
    )
    return int(replica["sequences_held"]), queued


def _wait_until(predicate: Callable[[], bool], last_seen: Callable[[], str], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out; last seen {last_seen()}")
        time.sleep(0.05)  # polling the workers' operator endpoints: they offer nothing to wait on


def _finished(metrics_url: str) -> int:
    text = httpx.get(metrics_url, timeout=10).text
    return sum(
        int(float(m.group(1)))
        for m in re.finditer(
            r'^floodgate_requests_finished_total\{[^}]*tier="paid"[^}]*\} (\S+)$', text, re.M
        )
    )


def _wait_answering(url: str, proc: subprocess.Popen[str]) -> None:
    for _ in range(1500):
        if proc.poll() is not None:
            said = proc.stdout.read() if proc.stdout is not None else ""
            raise AssertionError(f"floodgate serve exited ({proc.returncode}): {said[-2000:]}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        try:
            proc.wait(timeout=0.05)
        except subprocess.TimeoutExpired:
            continue
    raise AssertionError(f"{url} never answered")


def _two_workers_answering(tmp_path: Path, redis: RedisServer) -> tuple[subprocess.Popen[str], list[int]]:
    """`floodgate serve --workers 2` with both workers answering, and their pids; the caller ends
    it (killed here where they never answered)."""
    port, ops_port = free_port(), free_consecutive_ports(2)
    proc = subprocess.Popen(
        _serve_two_workers(tmp_path, redis, port, ops_port),
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        for worker_ops in (ops_port, ops_port + 1):
            _wait_answering(f"http://127.0.0.1:{worker_ops}/readyz", proc)
        workers = _workers_of(proc.pid)
        assert len(workers) == 2, workers
    except BaseException:
        proc.kill()
        proc.communicate(timeout=60)
        raise
    return proc, workers


def _serve_after_one_worker_gets(tmp_path: Path, redis: RedisServer, signum: int) -> tuple[int, str]:
    """`serve --workers 2`'s exit code and output once its first worker alone got `signum`."""
    proc, workers = _two_workers_answering(tmp_path, redis)
    try:
        os.kill(workers[0], signum)
        output, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=60)
    return proc.returncode, output


@pytest.mark.server  # runs `floodgate serve --workers 2` itself, through subprocess
def test_a_worker_killed_alone_stops_serve_with_the_kills_exit_code(
    tmp_path: Path, redis: RedisServer
) -> None:
    """A worker the OOM killer takes (SIGKILL): serve exits 137, 128 + 9, as a shell and Docker
    say a kill; it exited 247 (multiprocessing's -9 passed to sys.exit), read as no signal at all."""
    returncode, output = _serve_after_one_worker_gets(tmp_path, redis, signal.SIGKILL)
    assert returncode == 128 + signal.SIGKILL, output[-2000:]


@pytest.mark.server  # runs `floodgate serve --workers 2` itself, through subprocess
def test_a_worker_stopped_alone_stops_serve_with_a_failure(tmp_path: Path, redis: RedisServer) -> None:
    """One worker given a SIGTERM of its own drains and exits 0, and the others follow: the edge
    stopped serving unasked. serve exited 0 then, and a supervisor restarting it on failure only
    (systemd's Restart=on-failure) left the host without an edge."""
    returncode, output = _serve_after_one_worker_gets(tmp_path, redis, signal.SIGTERM)
    assert returncode == 1, output[-2000:]
    assert "exited on its own (code 0); stopping the others" in output, output[-4000:]


def _workers_of(pid: int) -> list[int]:
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return [int(c) for c in children if b"spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes()]


def _running(pid: int) -> bool:
    """Neither gone nor a zombie left for its new parent to reap."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):  # ESRCH: a read racing the reap
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.server  # runs `floodgate serve --workers 2` itself, through subprocess
def test_workers_leave_when_their_parent_is_killed(tmp_path: Path, redis: RedisServer) -> None:
    """A parent killed outright (the OOM killer, `kill -9`) passes no signal on: its workers must
    not serve on for ever as orphans beside the edge a supervisor starts in its place."""
    proc, workers = _two_workers_answering(tmp_path, redis)
    proc.kill()
    proc.communicate(timeout=60)
    deadline = time.monotonic() + 60
    while any(_running(w) for w in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    still = [w for w in workers if _running(w)]
    for w in still:
        os.kill(w, signal.SIGKILL)
    assert not still, "workers outlived their killed parent"


@pytest.mark.server  # runs `floodgate serve --workers 2` itself, through subprocess
@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "sigint"])
@pytest.mark.parametrize("started", [1, 2], ids=["one-started", "both-started"])
def test_a_stop_while_the_workers_start_is_no_failure(
    tmp_path: Path, redis: RedisServer, started: int, stop: signal.Signals
) -> None:
    """A SIGTERM passed on to a worker still starting (before its handlers are in place) kills it
    with that signal, and serve exited -15 (241) for a stop it was asked for. One that reached the
    parent while it was still starting them (`started` 1) killed the parent itself (-15), the
    workers left reading a pipe it had closed; a Ctrl-C passed on to a worker whose interpreter was
    still starting raised KeyboardInterrupt there (exit 1, a failure). Reviews, each."""
    proc = subprocess.Popen(
        _serve_two_workers(tmp_path, redis, free_port(), free_consecutive_ports(2)),
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while len(_workers_of(proc.pid)) < started and time.monotonic() < deadline:
            time.sleep(0.005)  # polling /proc for the parent's children: nothing to wait on
        proc.send_signal(stop)  # spawned, not past their imports yet
        output, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=60)
    assert proc.returncode == 0, output[-2000:]


@pytest.mark.server  # runs `floodgate serve --workers 2` itself, through subprocess
def test_every_line_of_a_worker_and_of_its_engine_names_the_worker(
    tmp_path: Path, redis: RedisServer
) -> None:
    """The engine process a worker starts writes to the same standard output: its lines (`engine
    started`, an engine failure's traceback) said nothing of the worker whose engine it is."""
    proc, _ = _two_workers_answering(tmp_path, redis)
    proc.terminate()
    output, _ = proc.communicate(timeout=60)
    lines = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
    engines = [line for line in lines if line.get("event") == "engine started"]
    assert sorted(line.get("worker") for line in engines) == [0, 1], engines
    assert [line for line in lines if "worker" not in line] == []


@pytest.mark.parametrize(("port", "ops_port"), [(8000, 7999), (8000, 65535)])
def test_workers_refuse_operator_ports_that_reach_the_api_port_or_past_the_last(
    port: int, ops_port: int
) -> None:
    """Worker 1's operator listener is ops_port + 1: the API port itself (refused at each load, so
    a ValidationError traceback from that worker, the others stopped) or port 65536 (the same)."""
    settings = load_settings(
        None, {"limiter": {"backend": "redis"}, "server": {"port": port, "ops_port": ops_port}}
    )
    assert worker_overrides(settings, 2, 0)["server"]["ops_port"] == ops_port
    with pytest.raises(WorkersRefused, match=rf"server\.ops_port {ops_port} \+ 1"):
        worker_overrides(settings, 2, 1)


@pytest.mark.server  # runs `floodgate serve --workers 2` itself, through subprocess
def test_a_draining_worker_answers_on_its_operator_port_until_its_streams_end(
    tmp_path: Path, redis: RedisServer
) -> None:
    """Each worker's operator listener (ops_port + i) closed with the shared port at the end of
    the accept window (0 s here): the worker still finishing a stream was refused to every probe
    and scrape of its port for the rest of its drain. It answers now until its streams have ended:
    alive, `/readyz` 503 `draining`."""
    port, ops_port = free_port(), free_consecutive_ports(2)
    command = _serve_two_workers(tmp_path, redis, port, ops_port, paid="max_concurrent = 16\n")
    proc = subprocess.Popen(
        command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    engines: list[int] = []
    try:
        headers = _dev_key_headers(proc)
        for worker_ops in (ops_port, ops_port + 1):
            _wait_answering(f"http://127.0.0.1:{worker_ops}/readyz", proc)
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 2000,
            "ignore_eos": True,
            "stream": True,
        }
        lines: list[str] = []
        first_token = threading.Event()

        def stream() -> None:
            with (
                httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as client,
                client.stream("POST", CHAT, json=body, headers=headers) as response,
            ):
                for line in response.iter_lines():
                    lines.append(line)
                    first_token.set()

        reader = threading.Thread(target=stream, daemon=True)
        reader.start()
        assert first_token.wait(60), "the stream never began"
        # Every worker's engine held still: the stream cannot finish by itself, whichever has it.
        engines = [
            int(c)
            for w in _workers_of(proc.pid)
            for c in Path(f"/proc/{w}/task/{w}/children").read_text().split()
            if b"resource_tracker" not in Path(f"/proc/{c}/cmdline").read_bytes()
        ]
        for pid in engines:
            os.kill(pid, signal.SIGSTOP)
        holding = next(o for o in (ops_port, ops_port + 1) if _held_and_queued(o) == (1, 0))
        proc.send_signal(signal.SIGTERM)

        def shared_port_closed() -> bool:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1.0).close()
            except OSError:
                return True
            return False

        _wait_until(shared_port_closed, lambda: "the shared port still accepting")
        assert reader.is_alive()  # the drain deadline is 90 s away
        with httpx.Client(base_url=f"http://127.0.0.1:{holding}", timeout=10) as probe:
            alive, ready = probe.get("/healthz"), probe.get("/readyz")
        proc.send_signal(signal.SIGTERM)  # the second: the workers cut their streams
        reader.join(30)
        assert not reader.is_alive()
    finally:
        for pid in engines:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        proc.terminate()
        output, _ = proc.communicate(timeout=60)
    assert alive.status_code == 200
    assert ready.status_code == 503 and ready.json()["status"] == "draining"
    assert proc.returncode == 0, output[-2000:]
    assert [line for line in lines if line][-1] == "data: [DONE]"
