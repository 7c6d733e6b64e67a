"""`floodgate serve` and `floodgate chat` as a user runs them (`floodgate keys`: tests/keys/)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.edge.conftest import BOTH_PATHS
from tests.edge.sse_client import CHAT, DONE, MODEL, events
from tests.support.ascii_locale import ascii_locale_env
from tests.support.live_server import LiveServer, demo_model_dir
from tests.support.ports import free_port

# `floodgate chat` streams from the edge on either upstream path (see tests/edge/conftest.py).
UPSTREAMS = BOTH_PATHS
# The SIGTERM that ends these servers is not what they test: no 15 s of draining (tests/faults/).
NO_DRAIN = "drain_accept_s = 0.0\ndrain_deadline_s = 0.0\n"


def _demo_config(tmp_path: Path, server: str = "", more: str = "") -> Path:
    """A settings file serving the demo model from `tmp_path`: `server`, further [server] lines;
    `more`, further tables."""
    config = tmp_path / "floodgate.toml"
    config.write_text(
        f'[model]\nsource = "demo"\nname = "{MODEL}"\ndemo_dir = "{demo_model_dir()}"\n'
        f'[messages]\nsqlite_path = "{tmp_path / "messages.db"}"\n{more}'
        f'[server]\nkeys_file = "{tmp_path / "keys.jsonl"}"\nops_port = 0\n{server}'
    )
    return config


@pytest.mark.server  # runs `floodgate serve` itself, through subprocess
def test_serve_prints_a_dev_key_that_streams(tmp_path: Path) -> None:
    port = free_port()
    config = _demo_config(tmp_path, NO_DRAIN)
    command = [sys.executable, "-m", "edge.cli", "serve", "--config", str(config), "--port", str(port)]
    proc = subprocess.Popen(
        command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline() for _ in range(4)]
        key_match = re.search(r"(fg-\S+)", lines[1])
        assert key_match, lines
        assert lines[3].strip().startswith(f"curl -N http://127.0.0.1:{port}{CHAT}")
        base = f"http://127.0.0.1:{port}"
        headers = {"Authorization": f"Bearer {key_match.group(1)}"}
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": "Hello!"}],
            "stream": True,
            "max_tokens": 4,
        }
        with httpx.Client(base_url=base, timeout=30) as client:
            _wait_listening(client, proc)
            with client.stream("POST", CHAT, json=body, headers=headers) as response:
                assert response.status_code == 200
                assert list(events(response))[-1] == DONE
        # The engine runs in a process of its own: the edge's, on a model already built, never
        # loads numpy (0.2 s of CPU a start, and OpenBLAS's threads).
        maps = Path(f"/proc/{proc.pid}/maps").read_text()
        assert "_multiarray_umath" not in maps and "openblas" not in maps.lower()
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.mark.server  # runs `floodgate serve` itself, through subprocess
def test_serve_prints_a_new_dev_key_when_every_stored_key_is_revoked(tmp_path: Path) -> None:
    """A stored key counted whatever its state: a user who revoked the printed key (or whose keys
    had all expired) started serve again to no key at all, and every request of theirs a 401."""
    config = _demo_config(tmp_path, NO_DRAIN)
    cli = [sys.executable, "-m", "edge.cli"]
    made = subprocess.run(
        [*cli, "keys", "create", "--user", "dev", "--tier", "paid", "--config", str(config)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    )
    old_key = made.stdout.strip()
    listed = subprocess.run(
        [*cli, "keys", "list", "--json", "--config", str(config)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    )
    [record] = json.loads(listed.stdout)
    subprocess.run([*cli, "keys", "revoke", record["id"], "--config", str(config)], cwd=tmp_path, check=True)
    port = free_port()
    proc = subprocess.Popen(
        [*cli, "serve", "--config", str(config), "--port", str(port)],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline() for _ in range(2)]
        key_match = re.search(r"(fg-\S+)", lines[1])
        assert key_match and key_match.group(1) != old_key, lines
        body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            _wait_listening(client, proc)
            for key, status in ((key_match.group(1), 200), (old_key, 401)):
                response = client.post(CHAT, json=body, headers={"Authorization": f"Bearer {key}"})
                assert response.status_code == status, response.text
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.mark.server  # runs `floodgate serve` itself, through subprocess
def test_serve_builds_the_demo_model_and_streams_under_an_ascii_locale(tmp_path: Path) -> None:
    """The checkpoint's files (tokenizer.json, tokenizer_config.json, config.json) were written and
    read in the locale's encoding: under a plain C locale without Python's UTF-8 coercion the demo
    tokenizer's non-ASCII pieces ended `floodgate serve` in a UnicodeEncodeError before it
    listened (a GGUF's import alike). JSON is UTF-8, whatever the locale."""
    port = free_port()
    config = tmp_path / "floodgate.toml"
    config.write_text(
        f'[model]\nsource = "demo"\nname = "{MODEL}"\ndemo_dir = "{tmp_path / "demo"}"\n'
        f'[messages]\nsqlite_path = "{tmp_path / "messages.db"}"\n'
        f'[server]\nkeys_file = "{tmp_path / "keys.jsonl"}"\nops_port = 0\n{NO_DRAIN}'
    )
    command = [sys.executable, "-m", "edge.cli", "serve", "--config", str(config), "--port", str(port)]
    proc = subprocess.Popen(
        command,
        cwd=tmp_path,
        env=ascii_locale_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline() for _ in range(4)]
        key_match = re.search(r"(fg-\S+)", lines[1])
        if key_match is None:
            rest, _ = proc.communicate(timeout=30)  # the traceback, whole
            raise AssertionError(("".join(lines) + rest)[-3000:])
        headers = {"Authorization": f"Bearer {key_match.group(1)}"}
        body = {"model": MODEL, "messages": [{"role": "user", "content": "Hello!"}], "stream": True}
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            _wait_listening(client, proc)
            with client.stream("POST", CHAT, json={**body, "max_tokens": 4}, headers=headers) as response:
                assert response.status_code == 200
                assert list(events(response))[-1] == DONE
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.mark.server  # runs `floodgate serve` itself, through subprocess
def test_a_served_edges_log_line_beyond_ascii_is_written_under_an_ascii_locale(tmp_path: Path) -> None:
    """The log lines went to stdout in the locale's encoding: under a plain C locale without
    Python's UTF-8 coercion, a line with a character beyond ASCII (the path of a 404 for `/café`;
    a user, a label, a model so named) raised UnicodeEncodeError inside the request, answered by
    uvicorn's plain-text 500 with no request id, and no line logged. JSON is UTF-8."""
    port = free_port()
    config = _demo_config(tmp_path, f"dev_key = false\n{NO_DRAIN}")
    command = [sys.executable, "-m", "edge.cli", "serve", "--config", str(config), "--port", str(port)]
    proc = subprocess.Popen(
        command, cwd=tmp_path, env=ascii_locale_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    # A bound on the wait for the log line: a server that never logs it is ended, its output closed.
    deadline = threading.Timer(60, proc.terminate)
    deadline.start()
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            _wait_listening(client, proc)
            answer = client.get("/caf%C3%A9")
        assert answer.status_code == 404, answer.text
        assert answer.json()["error"]["message"] == "Invalid URL (GET /caf\u00e9)"
        assert proc.stdout is not None
        refused = None
        for line in proc.stdout:
            if b'"request_refused"' in line:
                refused = json.loads(line.decode("utf-8"))
                break
        assert refused is not None, "the 404 was never logged"
        assert refused["path"] == "/caf\u00e9" and refused["request_id"] == answer.headers["x-request-id"]
    finally:
        deadline.cancel()
        proc.terminate()
        proc.wait(timeout=30)


def test_serve_without_dev_key_creates_and_prints_no_key(tmp_path: Path) -> None:
    port = free_port()
    keys_file = tmp_path / "keys.jsonl"
    config = tmp_path / "floodgate.toml"
    config.write_text(
        f'[model]\nsource = "demo"\nname = "{MODEL}"\ndemo_dir = "{demo_model_dir()}"\n'
        f'[messages]\nsqlite_path = "{tmp_path / "messages.db"}"\n'
        f'[server]\nkeys_file = "{keys_file}"\ndev_key = false\nops_port = 0\n{NO_DRAIN}'
    )
    command = [sys.executable, "-m", "edge.cli", "serve", "--config", str(config), "--port", str(port)]
    proc = subprocess.Popen(
        command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            _wait_listening(client, proc)
            assert client.get("/v1/models").status_code == 401  # no key exists to use
    finally:
        proc.terminate()
        output, _ = proc.communicate(timeout=30)
    assert not keys_file.exists()
    assert "fg-" not in output and "created one for user" not in output


def test_chat_help_lists_its_options() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "edge.cli", "chat", "--help"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0
    assert done.stdout.startswith("usage: floodgate chat") and "--base-url" in done.stdout


def test_chat_streams_a_reply_from_a_live_edge(server: LiveServer) -> None:
    command = [sys.executable, "-m", "edge.cli", "chat", "Hello!", "--base-url", server.base_url]
    command += ["--model", MODEL, "--max-tokens", "4", "--json"]
    env = os.environ | {"FLOODGATE_API_KEY": server.keys["paid"]}
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    kinds = [json.loads(line)["type"] for line in done.stdout.splitlines()]
    assert kinds[0] == "request_started" and kinds[-1] == "finished"


def test_chat_without_a_key_exits_2(local_server: LiveServer) -> None:
    # Refused before any request is sent: one path is enough.
    env = {k: v for k, v in os.environ.items() if k != "FLOODGATE_API_KEY"}
    command = [sys.executable, "-m", "edge.cli", "chat", "Hello!", "--base-url", local_server.base_url]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 2 and "FLOODGATE_API_KEY" in done.stderr


@pytest.mark.server  # runs `floodgate serve` itself, through subprocess
def test_serve_port_0_binds_a_free_port_and_logs_it(tmp_path: Path) -> None:
    """`--port 0` is a port the kernel picks, as server.port = 0 is (uvicorn's --port 0 too): it
    was taken for "not given" and the configured port was bound, and nothing said which port."""
    configured = free_port()
    config = _demo_config(tmp_path, f"dev_key = false\nport = {configured}\n{NO_DRAIN}")
    with _serving_on_port_0(tmp_path, config) as proc:
        assert proc.stdout is not None
        listening = None
        for line in proc.stdout:
            if '"edge_listening"' in line:
                listening = json.loads(line)
                break
        assert listening is not None, "floodgate serve never logged the address it listens on"
        host, port = listening["public"].rsplit(":", 1)
        assert host == "127.0.0.1" and int(port) not in (0, configured), listening
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            _wait_listening(client, proc)


@pytest.mark.server  # runs `floodgate serve` itself, through subprocess
def test_serve_ops_port_moves_the_operator_listener(tmp_path: Path) -> None:
    """A second edge on one host met the first's operator port (9464 by default), which only a
    config file could change, where `--port` moves the public one."""
    given = free_port()
    config = _demo_config(tmp_path, f"dev_key = false\n{NO_DRAIN}")  # ops_port 0: any free port
    with _serving_on_port_0(tmp_path, config, "--ops-port", str(given)) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            if '"edge_listening"' in line:
                break
        with httpx.Client(base_url=f"http://127.0.0.1:{given}", timeout=30) as client:
            _wait_listening(client, proc)
            assert "floodgate_open_streams" in client.get("/metrics").text


@pytest.mark.server  # runs `floodgate serve` itself, through subprocess
def test_serve_triton_empty_serves_the_local_engines_over_a_files_triton(tmp_path: Path) -> None:
    """`--triton ""` is upstream.triton's own value for the local CPU engines: it was taken for
    "not given", and the config file's Triton replicas (here, none listening) served instead."""
    more = f'[upstream]\ntriton = "127.0.0.1:{free_port()}"\n'
    config = _demo_config(tmp_path, f"dev_key = false\n{NO_DRAIN}", more)
    with _serving_on_port_0(tmp_path, config, "--triton", "") as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            if '"edge_listening"' in line:
                port = json.loads(line)["public"].rsplit(":", 1)[1]
                break
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            _wait_listening(client, proc)


def test_serve_host_empty_is_refused_not_ignored(tmp_path: Path) -> None:
    """`--host ""` bound the file's address, as if not given, where server.host = "" is refused
    (the socket's empty address is every interface)."""
    config = _demo_config(tmp_path, "dev_key = false\n")
    done = subprocess.run(
        [sys.executable, "-m", "edge.cli", "serve", "--config", str(config), "--host", "", "--port", "0"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1 and "server.host is empty" in done.stderr, done.stderr


@contextlib.contextmanager
def _serving_on_port_0(tmp_path: Path, config: Path, *args: str) -> Iterator[subprocess.Popen[str]]:
    """`floodgate serve --port 0` of this checkout (wherever the environment's editable install
    points), its log lines on stdout; ended at the exit, and after 60 s whatever happens: a server
    that never logs what a test waits for is ended, its output closed."""
    command = [sys.executable, "-m", "edge.cli", "serve", "--config", str(config), "--port", "0", *args]
    env = os.environ | {"PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.Popen(
        command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    deadline = threading.Timer(60, proc.terminate)
    deadline.start()
    try:
        yield proc
    finally:
        deadline.cancel()
        proc.terminate()
        proc.wait(timeout=30)


def _wait_listening(client: httpx.Client, proc: subprocess.Popen[str] | subprocess.Popen[bytes]) -> None:
    # The key is printed before uvicorn binds: retry connecting until it answers (bounded).
    for _ in range(500):
        assert proc.poll() is None, "floodgate serve exited"
        try:
            if client.get("/readyz").status_code == 200:
                return
        except httpx.TransportError:
            pass
        try:
            proc.wait(timeout=0.02)
        except subprocess.TimeoutExpired:
            continue
    raise AssertionError("floodgate serve never became ready")


def test_serve_refuses_one_port_for_both_listeners(tmp_path: Path) -> None:
    """A request's listener is told by its local port (edge/routes/listeners.py): the public API on
    127.0.0.1:P and the operator listener on 127.0.0.2:P answered /metrics on the public one."""
    config = tmp_path / "floodgate.toml"
    port = free_port()
    config.write_text(f'[server]\nport = {port}\nops_host = "127.0.0.2"\nops_port = {port}\n')
    done = subprocess.run(
        [sys.executable, "-m", "edge.cli", "serve", "--config", str(config)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert f"server.ops_port {port} is server.port too" in done.stderr


def test_serve_refuses_workers_it_cannot_run_before_minting_a_dev_key(tmp_path: Path) -> None:
    """`serve --workers 2` with the default (memory) limiter, or with `--port 0`, is refused: said
    before the model is prepared and before a dev key is made. After them, the refused serve printed
    "Try it: curl ..." for an edge that never started, and the next serve, the store holding that
    key, printed none."""
    config = _demo_config(tmp_path, more=f'[keys]\nsqlite_path = "{tmp_path / "keys.db"}"\n')
    # Refused before the limiter's Redis is reached: none need run.
    shared = tmp_path / "shared-limiter.toml"
    shared.write_text(
        config.read_text() + '[limiter]\nbackend = "redis"\nredis_url = "redis://127.0.0.1:1/0"\n'
    )
    env = os.environ | {"PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    cases = ((config, [], 'backend = "redis"'), (shared, ["--port", "0"], "needs a fixed port"))
    for settings, extra, refusal in cases:
        command = [sys.executable, "-m", "edge.cli", "serve", "--config", str(settings), "--workers", "2"]
        done = subprocess.run(
            [*command, *extra], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode != 0 and refusal in done.stderr, done.stderr
        assert "created one for user" not in done.stdout and "curl" not in done.stdout, done.stdout


@pytest.mark.server  # runs `floodgate serve` itself, through subprocess
def test_serve_on_an_ipv6_host_prints_a_dev_key_curl_that_reaches_it(tmp_path: Path) -> None:
    """`serve --host ::1` listens on IPv6 (edge/server.py binds AF_INET6); the hint's URL must
    bracket the address (`http://[::1]:P`): `http://::1:P` is no URL curl or any client takes."""
    port = free_port()
    config = _demo_config(tmp_path, NO_DRAIN, more=f'[keys]\nsqlite_path = "{tmp_path / "keys.db"}"\n')
    command = [sys.executable, "-m", "edge.cli", "serve", "--config", str(config), "--host", "::1"]
    env = os.environ | {"PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.Popen(
        [*command, "--port", str(port)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = threading.Timer(60, proc.terminate)
    deadline.start()
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline() for _ in range(4)]
        url = lines[3].split()[2]
        assert url == f"http://[::1]:{port}{CHAT}", lines
        with httpx.Client(base_url=url.removesuffix(CHAT), timeout=30) as client:
            _wait_listening(client, proc)
    finally:
        deadline.cancel()
        proc.terminate()
        proc.wait(timeout=30)


def test_serve_prints_a_dev_key_curl_whose_body_is_json_whatever_the_model_name(tmp_path: Path) -> None:
    """The hint's body put the model's name between quotes as it is: a name with a '"' or a '\\'
    (config allows both) printed a body that is no JSON, and the curl a user pasted got a 400."""
    name = 'demo "quoted" back\\slash'
    port = free_port()
    config = _demo_config(tmp_path, NO_DRAIN)
    # A TOML literal string: the name's quote and backslash as they are.
    config.write_text(config.read_text().replace(f'name = "{MODEL}"', f"name = '{name}'"))
    command = [sys.executable, "-m", "edge.cli", "serve", "--config", str(config), "--port", str(port)]
    env = os.environ | {"PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.Popen(
        command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    deadline = threading.Timer(60, proc.terminate)
    deadline.start()
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline() for _ in range(4)]
        words = shlex.split(lines[3])
        body = json.loads(words[words.index("-d") + 1])
        assert body["model"] == name, lines
        headers = dict(words[i + 1].split(": ", 1) for i, word in enumerate(words) if word == "-H")
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            _wait_listening(client, proc)
            answer = client.post(CHAT, json=body | {"stream": False, "max_tokens": 4}, headers=headers)
            assert answer.status_code == 200, answer.text
            assert answer.json()["model"] == name
    finally:
        deadline.cancel()
        proc.terminate()
        proc.wait(timeout=30)


def test_serve_on_a_port_in_use_is_refused_before_minting_a_dev_key(tmp_path: Path) -> None:
    """A port something listens on already (another edge, a dev server) was found only at the bind,
    after the model's import and the dev key: the refused serve printed "Try it: curl ..." with a
    key for an edge that never started, and the next serve, the store holding that key, printed
    none. As `--workers` is (test above), it is refused first, the public port and the operator's."""
    config = _demo_config(tmp_path, more=f'[keys]\nsqlite_path = "{tmp_path / "keys.db"}"\n')
    env = os.environ | {"PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for option in ("--port", "ops_port"):
            settings = config
            if option == "ops_port":
                settings = tmp_path / "ops.toml"
                settings.write_text(config.read_text().replace("ops_port = 0", f"ops_port = {port}"))
            extra = ["--port", str(port)] if option == "--port" else ["--port", "0"]
            done = subprocess.run(
                [sys.executable, "-m", "edge.cli", "serve", "--config", str(settings), *extra],
                cwd=tmp_path,
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert done.returncode == 1, done.stderr
            said = done.stderr.strip().splitlines()[-1]
            assert said.startswith("floodgate: cannot listen on ") and "already in use" in said, done.stderr
            assert "created one for user" not in done.stdout and "curl" not in done.stdout, done.stdout


def test_serve_on_an_address_not_of_this_machine_is_refused_before_minting_a_dev_key(
    tmp_path: Path,
) -> None:
    """`--host <typo> --port 0`: the early bind check skipped port 0, so the typo was found only at
    the bind, after the model's import, the dev key ("Try it: curl ...") and the app's start. It is
    refused first with one line, as a port in use is, for the public host and the operator's."""
    config = _demo_config(tmp_path, more=f'[keys]\nsqlite_path = "{tmp_path / "keys.db"}"\n')
    env = os.environ | {"PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    unassigned = "192.0.2.1"  # TEST-NET-1 (RFC 5737): documentation only, no interface has it
    for where, named in (("--host", ""), ("ops_host", " (ops_port)")):
        settings = config
        extra = ["--port", "0"]
        if where == "ops_host":
            settings = tmp_path / "ops.toml"
            settings.write_text(config.read_text() + f'ops_host = "{unassigned}"\n')
        else:
            extra += ["--host", unassigned]
        done = subprocess.run(
            [sys.executable, "-m", "edge.cli", "serve", "--config", str(settings), *extra],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert "created one for user" not in done.stdout and "curl" not in done.stdout, done.stdout
        assert done.returncode == 1, done.stderr
        assert done.stderr.strip().splitlines() == [
            f"floodgate: cannot listen on {unassigned}:0{named}: Cannot assign requested address"
        ], done.stderr


def test_serve_workers_with_an_operator_port_in_use_is_refused_before_minting_a_dev_key(
    tmp_path: Path,
) -> None:
    """`serve --workers 2` gives worker i the operator port server.ops_port + i. One that something
    listens on already (Prometheus's node exporter, another edge) was found only by that worker's
    bind, after the model's import and the dev key: the refused serve printed "Try it: curl ..."
    for an edge that never started. Refused first, as the public port is and a lone serve's two."""
    config = _demo_config(tmp_path, more=f'[keys]\nsqlite_path = "{tmp_path / "keys.db"}"\n')
    env = os.environ | {"PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        ops = taken.getsockname()[1] - 1  # worker 1's operator port is the one taken
        settings = tmp_path / "workers.toml"
        settings.write_text(
            config.read_text().replace("ops_port = 0", f"ops_port = {ops}")
            + '[limiter]\nbackend = "redis"\nredis_url = "redis://127.0.0.1:1/0"\n'
        )
        command = [sys.executable, "-m", "edge.cli", "serve", "--config", str(settings)]
        proc = subprocess.Popen(
            [*command, "--workers", "2", "--port", str(free_port())],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            out, err = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.terminate()
                proc.communicate(timeout=30)
    assert "created one for user" not in out and "curl" not in out, out
    assert proc.returncode == 1, err
    said = err.strip().splitlines()[-1]
    # Worker 1's port is the one this test holds; worker 0's, the one below it, is free only as far
    # as the kernel's picks for other tests running beside it allow (a fresh-clone CI run found
    # another test's listener there): either is the same refusal before the dev key.
    refusals = {
        f"floodgate: cannot listen on 127.0.0.1:{ops + i} (worker {i}'s ops_port): Address already in use"
        for i in (0, 1)
    }
    assert said in refusals, err


@pytest.mark.server  # runs `floodgate serve` itself, through subprocess
def test_serve_says_when_it_accepts_and_accepts_from_then_on(tmp_path: Path) -> None:
    """`edge_listening` comes as the ports are bound, before the app's start-up (the engines load:
    seconds with a real model), and the dev key's `curl` hint before that: a client taking either
    for the go-ahead met a refused connection. `edge_serving` says the public port accepts, and a
    request sent the moment it is read is answered."""
    config = _demo_config(tmp_path, f"dev_key = false\n{NO_DRAIN}")
    with _serving_on_port_0(tmp_path, config) as proc:
        assert proc.stdout is not None
        events = []
        for line in proc.stdout:
            if line.startswith("{"):
                events.append(json.loads(line))
                if events[-1]["event"] == "edge_serving":
                    break
        assert events and events[-1]["event"] == "edge_serving", events
        listening = next(e for e in events if e["event"] == "edge_listening")
        assert events[-1]["public"] == listening["public"]
        answer = httpx.get(f"http://{events[-1]['public']}/healthz", timeout=30)
        assert answer.status_code == 200
