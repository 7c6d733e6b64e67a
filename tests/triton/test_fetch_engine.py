"""fetch_engine against a real S3 API (moto's server on a loopback port)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from boto3.s3.transfer import TransferConfig
from moto.server import ThreadedMotoServer

from gpu_container.triton.fetch_engine import MANIFEST_NAME, EngineFetchError, fetch_engine, parse_s3_uri
from tests.support.ports import free_port

BUCKET = "engines"
MIB = 1 << 20


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture
def s3(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    for name, value in {
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(name, value)
    client = boto3.client("s3", endpoint_url=s3_endpoint)
    client.create_bucket(Bucket=BUCKET)
    yield client
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET):
        for obj in page.get("Contents", []):
            client.delete_object(Bucket=BUCKET, Key=obj["Key"])
    client.delete_bucket(Bucket=BUCKET)


def _upload(s3: Any, files: dict[str, bytes], prefix: str = "llama/") -> None:
    for name, data in files.items():
        s3.put_object(Bucket=BUCKET, Key=prefix + name, Body=data)


def test_parse_s3_uri() -> None:
    assert parse_s3_uri("s3://b/engines/llama") == ("b", "engines/llama/")
    assert parse_s3_uri("s3://b") == ("b", "")
    with pytest.raises(ValueError):
        parse_s3_uri("https://b/x")


def test_downloads_every_file_under_the_prefix(s3: Any, tmp_path: Path) -> None:
    files = {"config.json": b'{"a": 1}', "rank0.engine": os.urandom(200_000), "sub/rank1.engine": b"x" * 10}
    _upload(s3, files)
    _upload(s3, {"other.engine": b"not mine"}, prefix="llama-other/")
    paths = fetch_engine(f"s3://{BUCKET}/llama/", tmp_path, s3=s3)
    assert sorted(p.relative_to(tmp_path).as_posix() for p in paths) == sorted(files)
    for name, data in files.items():
        assert (tmp_path / name).read_bytes() == data
    assert not (tmp_path / "other.engine").exists()
    assert (tmp_path / MANIFEST_NAME).is_file()


def test_multipart_object_is_verified_by_its_part_md5s(s3: Any, tmp_path: Path) -> None:
    source = tmp_path / "big.engine"
    source.write_bytes(os.urandom(11 * MIB))
    config = TransferConfig(multipart_threshold=5 * MIB, multipart_chunksize=5 * MIB)
    s3.upload_file(str(source), BUCKET, "llama/rank0.engine", Config=config)
    assert "-" in s3.head_object(Bucket=BUCKET, Key="llama/rank0.engine")["ETag"]
    dest = tmp_path / "dest"
    fetch_engine(f"s3://{BUCKET}/llama", dest, s3=s3)
    assert (dest / "rank0.engine").read_bytes() == source.read_bytes()


def test_present_files_are_skipped_and_changed_ones_refetched(s3: Any, tmp_path: Path) -> None:
    _upload(s3, {"a.engine": b"first", "b.json": b"{}"})
    fetch_engine(f"s3://{BUCKET}/llama/", tmp_path, s3=s3)
    # A file the manifest vouches for is not downloaded again: the marker written here survives.
    (tmp_path / "b.json").write_bytes(b"[]")
    _upload(s3, {"a.engine": b"second version"})
    fetch_engine(f"s3://{BUCKET}/llama/", tmp_path, s3=s3)
    assert (tmp_path / "a.engine").read_bytes() == b"second version"
    assert (tmp_path / "b.json").read_bytes() == b"[]"


def test_empty_prefix_is_an_error(s3: Any, tmp_path: Path) -> None:
    with pytest.raises(EngineFetchError, match="no objects"):
        fetch_engine(f"s3://{BUCKET}/missing/", tmp_path, s3=s3)
