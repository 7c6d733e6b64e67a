"""Engine upload and fetch against a real S3 API (moto's server on a loopback port), on a bucket
encrypted with SSE-KMS as the engine bucket is (moto's KMS holds the key).

moto returns an MD5 ETag even for SSE-KMS objects; real S3 does not (its documentation: objects
encrypted by SSE-KMS have an ETag that is not an MD5 digest of their data). `kms_etags` makes the
client see what real S3 sends: a listing whose ETags are opaque. A fetcher that relies on ETags
fails there, as every GPU host did."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from boto3.s3.transfer import TransferConfig
from moto.server import ThreadedMotoServer

from gpu_container.triton.fetch_engine import (
    ENGINE_MANIFEST,
    LOCAL_RECORD,
    EngineFetchError,
    fetch_engine,
    parse_s3_uri,
    upload_engine,
)
from tests.support.ports import free_port
from tests.support.tcp_proxy import TcpProxy, running

BUCKET = "engines"
MIB = 1 << 20
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


def _opaque_etags(parsed: dict[str, Any], **_: Any) -> None:
    for obj in parsed.get("Contents", []):
        obj["ETag"] = f'"{secrets.token_hex(16)}"'


@pytest.fixture
def s3(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    for name, value in {
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(name, value)
    kms = boto3.client("kms", endpoint_url=s3_endpoint)
    key = kms.create_key(Description="engines")["KeyMetadata"]["Arn"]
    client = boto3.client("s3", endpoint_url=s3_endpoint)
    client.create_bucket(Bucket=BUCKET)
    client.put_bucket_encryption(
        Bucket=BUCKET,
        ServerSideEncryptionConfiguration={
            "Rules": [
                {
                    "ApplyServerSideEncryptionByDefault": {"SSEAlgorithm": "aws:kms", "KMSMasterKeyID": key},
                    "BucketKeyEnabled": True,
                }
            ]
        },
    )
    # What real S3 lists for SSE-KMS objects: ETags that are no MD5 of the data.
    client.meta.events.register("after-call.s3.ListObjectsV2", _opaque_etags)
    yield client
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET):
        for obj in page.get("Contents", []):
            client.delete_object(Bucket=BUCKET, Key=obj["Key"])
    client.delete_bucket(Bucket=BUCKET)


def _engine(root: Path, files: dict[str, bytes]) -> Path:
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return root


def test_parse_s3_uri() -> None:
    assert parse_s3_uri("s3://b/engines/llama") == ("b", "engines/llama/")
    assert parse_s3_uri("s3://b") == ("b", "")
    with pytest.raises(ValueError):
        parse_s3_uri("https://b/x")


def test_an_engine_uploaded_to_a_kms_bucket_fetches_verified(s3: Any, tmp_path: Path) -> None:
    files = {"config.json": b'{"a": 1}', "rank0.engine": os.urandom(200_000), "sub/rank1.engine": b"x" * 10}
    upload_engine(_engine(tmp_path / "built", files), f"s3://{BUCKET}/llama/", s3=s3)
    _engine(tmp_path / "other", {"other.engine": b"not mine"})
    upload_engine(tmp_path / "other", f"s3://{BUCKET}/llama-other/", s3=s3)

    dest = tmp_path / "dest"
    paths = fetch_engine(f"s3://{BUCKET}/llama/", dest, s3=s3)

    head = s3.head_object(Bucket=BUCKET, Key="llama/rank0.engine", ChecksumMode="ENABLED")
    assert head["ServerSideEncryption"] == "aws:kms"
    assert head["ChecksumSHA256"]  # stored by S3 at upload
    assert sorted(p.relative_to(dest).as_posix() for p in paths) == sorted(files)
    for name, data in files.items():
        assert (dest / name).read_bytes() == data
    assert not (dest / "other.engine").exists()
    assert not (dest / ENGINE_MANIFEST).exists()
    assert set(json.loads((dest / LOCAL_RECORD).read_text())) == set(files)


def test_a_multipart_upload_fetches_verified(
    s3: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    built = _engine(tmp_path / "built", {"big.engine": os.urandom(11 * MIB)})
    small_parts = TransferConfig(multipart_threshold=5 * MIB, multipart_chunksize=5 * MIB)
    real_upload = s3.upload_file
    monkeypatch.setattr(s3, "upload_file", lambda *a, **kw: real_upload(*a, **kw, Config=small_parts))
    upload_engine(built, f"s3://{BUCKET}/llama", s3=s3)
    assert "-" in s3.head_object(Bucket=BUCKET, Key="llama/big.engine")["ETag"]

    fetch_engine(f"s3://{BUCKET}/llama", tmp_path / "dest", s3=s3)

    assert (tmp_path / "dest" / "big.engine").read_bytes() == (built / "big.engine").read_bytes()


def test_an_object_replaced_after_the_upload_is_refused(s3: Any, tmp_path: Path) -> None:
    built = _engine(tmp_path / "built", {"rank0.engine": b"good weights"})
    upload_engine(built, f"s3://{BUCKET}/llama/", s3=s3)
    s3.put_object(Bucket=BUCKET, Key="llama/rank0.engine", Body=b"bad weights!")

    with pytest.raises(EngineFetchError, match=r"rank0\.engine: 12 bytes with SHA-256"):
        fetch_engine(f"s3://{BUCKET}/llama/", tmp_path / "dest", s3=s3)
    assert not (tmp_path / "dest" / "rank0.engine").exists()
    assert not (tmp_path / "dest" / "rank0.engine.part").exists()


def test_present_files_are_skipped_and_changed_ones_refetched(s3: Any, tmp_path: Path) -> None:
    built = _engine(tmp_path / "built", {"a.engine": b"first", "b.json": b"{}"})
    upload_engine(built, f"s3://{BUCKET}/llama/", s3=s3)
    dest = tmp_path / "dest"
    fetch_engine(f"s3://{BUCKET}/llama/", dest, s3=s3)
    # A file the record vouches for (same size) is not downloaded again: the marker survives.
    (dest / "b.json").write_bytes(b"[]")
    _engine(built, {"a.engine": b"second version"})
    upload_engine(built, f"s3://{BUCKET}/llama/", s3=s3)

    fetch_engine(f"s3://{BUCKET}/llama/", dest, s3=s3)

    assert (dest / "a.engine").read_bytes() == b"second version"
    assert (dest / "b.json").read_bytes() == b"[]"


def test_a_prefix_without_a_manifest_says_how_to_upload(s3: Any, tmp_path: Path) -> None:
    s3.put_object(Bucket=BUCKET, Key="half/rank0.engine", Body=b"partial upload")

    with pytest.raises(EngineFetchError, match=f"no {ENGINE_MANIFEST}.*--upload"):
        fetch_engine(f"s3://{BUCKET}/half/", tmp_path, s3=s3)


def _denied_as_s3_does(parsed: dict[str, Any], **_: Any) -> None:
    """Real S3 answers a missing object with 403 AccessDenied to a reader without s3:ListBucket on
    the bucket, as the GPU hosts' role is (moto answers 404 whatever the grants)."""
    if parsed.get("Error", {}).get("Code") == "NoSuchKey":
        parsed["Error"]["Code"] = "AccessDenied"


def test_a_manifest_the_host_may_not_list_says_how_to_upload(s3: Any, tmp_path: Path) -> None:
    s3.put_object(Bucket=BUCKET, Key="unlisted/rank0.engine", Body=b"partial upload")
    s3.meta.events.register("after-call.s3.GetObject", _denied_as_s3_does)

    with pytest.raises(EngineFetchError, match=f"{ENGINE_MANIFEST} .* missing .*--upload"):
        fetch_engine(f"s3://{BUCKET}/unlisted/", tmp_path, s3=s3)


class _HoldingProxy(TcpProxy):
    """In front of the S3 endpoint: relays until `budget` bytes of answers have gone back, then
    holds every further answer byte (on every connection) until `release()`: a download caught
    half-way, for as long as the test needs."""

    def __init__(self, upstream_port: int, budget: int) -> None:
        super().__init__(upstream_port)
        self.budget = budget
        self.holding = threading.Event()
        self._relayed = 0
        self._released = threading.Event()
        self._lock = threading.Lock()

    def release(self) -> None:
        self._released.set()

    def close(self) -> None:
        self._released.set()
        super().close()

    def _handle(self, client: socket.socket, number: int) -> None:
        upstream = self._upstream_for(client)
        threading.Thread(target=self._relay, args=(upstream, client, True), daemon=True).start()
        self._relay(client, upstream, False)

    def _relay(self, source: socket.socket, sink: socket.socket, answers: bool) -> None:
        while True:
            try:
                data = source.recv(65536)
            except OSError:
                return
            if not data:
                with contextlib.suppress(OSError):
                    sink.shutdown(socket.SHUT_WR)
                return
            if answers:
                with self._lock:
                    spent = self._relayed >= self.budget
                    self._relayed += len(data)
                if spent and not self._released.is_set():
                    self.holding.set()
                    self._released.wait()
            with contextlib.suppress(OSError):
                sink.sendall(data)


def _eventually(check: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.05)


def _through(proxy: _HoldingProxy) -> dict[str, str]:
    """The environment of a process that reaches S3 through `proxy` (boto3's AWS_ENDPOINT_URL)."""
    return {
        **os.environ,
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{proxy.port}",
        "PYTHONPATH": str(ROOT),
    }


def _downloads_in_progress(dest: Path) -> list[Path]:
    return [p for p in dest.glob("rank0.engine.part*") if p.stat().st_size > 0] if dest.is_dir() else []


def test_a_fetch_killed_mid_download_leaves_nothing_for_the_next_start(
    s3: Any, s3_endpoint: str, tmp_path: Path
) -> None:
    files = {"config.json": b"{}", "rank0.engine": os.urandom(4 * MIB)}
    upload_engine(_engine(tmp_path / "built", files), f"s3://{BUCKET}/llama/", s3=s3)
    dest = tmp_path / "engines" / "model"
    with running(_HoldingProxy(int(s3_endpoint.rsplit(":", 1)[1]), budget=MIB)) as proxy:
        fetch = subprocess.Popen(
            [sys.executable, "-m", "gpu_container.triton.fetch_engine", f"s3://{BUCKET}/llama/", str(dest)],
            cwd=ROOT,
            env=_through(proxy),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            _eventually(lambda: proxy.holding.is_set() and bool(_downloads_in_progress(dest)), "half-way")
            # What Docker does at its stop timeout, or a host losing power: no clean-up runs.
            fetch.kill()
        finally:
            fetch.kill()
            fetch.wait(timeout=30)
    assert _downloads_in_progress(dest)  # what boto3 wrote through: the engine's size, at the end

    fetch_engine(f"s3://{BUCKET}/llama/", dest, s3=s3)  # the container's next start

    # Only the engine: the half-written file is gone, not kept beside the whole one for good.
    assert sorted(p.name for p in dest.iterdir()) == sorted([LOCAL_RECORD, *files])
    assert (dest / "rank0.engine").read_bytes() == files["rank0.engine"]


def _can_be_pid_1() -> bool:
    """A new PID namespace (needs root, or an unprivileged user namespace `unshare` may open)."""
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "--pid", "--fork", "true"], capture_output=True, check=False)
    return probe.returncode == 0


def _only_child(proc: subprocess.Popen[str]) -> int:
    """`unshare --fork`'s only child: the entrypoint, PID 1 of its namespace."""
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
    _eventually(lambda: bool(children.read_text().split()), "the entrypoint started")
    (child,) = children.read_text().split()
    return int(child)


@pytest.mark.parametrize("as_pid_1", [True, False], ids=["pid-1", "plain-process"])
def test_a_container_stopped_while_it_fetches_the_engine_stops_and_cleans_up(
    s3: Any, s3_endpoint: str, tmp_path: Path, as_pid_1: bool
) -> None:
    """`docker stop` (SIGTERM) while the container's start-up downloads the engine, before any
    tritonserver runs: the image's CMD makes the entrypoint the container's PID 1, which the kernel
    gives only the signals it handles. It had no handler: the stop was dropped, the download went on
    until Docker's stop timeout killed it, and its partial file stayed on the host's engine volume."""
    if as_pid_1 and not _can_be_pid_1():
        pytest.skip("NOT RUN: cannot open a PID namespace here (needs root or user namespaces)")
    files = {"config.json": b"{}", "rank0.engine": os.urandom(4 * MIB)}
    upload_engine(_engine(tmp_path / "built", files), f"s3://{BUCKET}/llama/", s3=s3)
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    started = tmp_path / "tritonserver-started"
    (fake_bin / "tritonserver").write_text(f"#!/bin/sh\ntouch {started}\n")
    (fake_bin / "tritonserver").chmod(0o755)
    dest = tmp_path / "engines" / "model"
    entrypoint = [sys.executable, "-m", "gpu_container.triton.entrypoint"]
    argv = ["unshare", "--pid", "--fork", "--kill-child", *entrypoint] if as_pid_1 else entrypoint
    with running(_HoldingProxy(int(s3_endpoint.rsplit(":", 1)[1]), budget=MIB)) as proxy:
        env = {
            **_through(proxy),
            "PATH": f"{fake_bin}:{os.environ['PATH']}",
            "ENGINE_S3_URI": f"s3://{BUCKET}/llama/",
            "ENGINE_DIR": str(dest),
            "MODEL_REPOSITORY": str(tmp_path / "models"),
        }
        proc = subprocess.Popen(
            argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        said: list[str] = []
        try:
            _eventually(lambda: proxy.holding.is_set() and bool(_downloads_in_progress(dest)), "half-way")
            os.kill(_only_child(proc) if as_pid_1 else proc.pid, signal.SIGTERM)
            assert proc.stdout is not None
            # The stop is taken while the download is still held (dropped, nothing is ever said).
            reader = threading.Thread(target=lambda: said.extend(proc.stdout or []), daemon=True)
            reader.start()
            _eventually(
                lambda: (
                    proc.poll() is not None or any("stopped_before_tritonserver_started" in x for x in said)
                ),
                "the stop taken or the process gone",
            )
            assert any("stopped_before_tritonserver_started" in x for x in said), "".join(said)[-3000:]
            proxy.release()
            code = proc.wait(timeout=60)
            reader.join(timeout=30)
        finally:
            proc.kill()
            proc.wait(timeout=30)
    assert code == 0, "".join(said)[-3000:]
    assert not started.exists()
    assert not _downloads_in_progress(dest), sorted(p.name for p in dest.iterdir())
    assert not (dest / "rank0.engine").exists()
