"""Download a built TensorRT-LLM engine from S3 into a local folder, verified, at most once.

    python -m gpu_container.triton.fetch_engine s3://bucket/engines/llama-3-8b/ /engines/model

Every object under the prefix lands at the same relative path. A file is checked against the
object's size and ETag (the MD5 of a single-part upload, the MD5 of part MD5s for a multipart one);
a manifest beside the files records what was verified, so a restarted container skips them.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import boto3
import structlog

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

log = structlog.get_logger(__name__)

MANIFEST_NAME = ".floodgate-engine.json"
_READ_CHUNK = 1 << 20


class EngineFetchError(RuntimeError):
    """The prefix is empty, or a downloaded file does not match its object."""


@dataclass(frozen=True, slots=True)
class RemoteFile:
    key: str
    relative: str
    size: int
    etag: str


def parse_s3_uri(uri: str) -> tuple[str, str]:
    """`s3://bucket/a/b/` -> ("bucket", "a/b/"); the prefix always ends with a slash or is empty."""
    if not uri.startswith("s3://"):
        raise ValueError(f"not an s3:// URI: {uri!r}")
    bucket, _, prefix = uri[len("s3://") :].partition("/")
    if not bucket:
        raise ValueError(f"no bucket in {uri!r}")
    if prefix and not prefix.endswith("/"):
        prefix += "/"
    return bucket, prefix


def list_engine_files(s3: S3Client, bucket: str, prefix: str) -> list[RemoteFile]:
    files: list[RemoteFile] = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for obj in page.get("Contents", []):
            key = obj["Key"]
            if key.endswith("/"):
                continue
            files.append(RemoteFile(key, key[len(prefix) :], obj["Size"], obj["ETag"].strip('"')))
    return files


def _md5_of_chunks(path: Path, chunk_size: int) -> list[bytes]:
    digests: list[bytes] = []
    with path.open("rb") as f:
        while chunk := f.read(chunk_size):
            digests.append(hashlib.md5(chunk, usedforsecurity=False).digest())
    return digests


def _local_etag(s3: S3Client, bucket: str, remote: RemoteFile, path: Path) -> str:
    if "-" not in remote.etag:
        digest = hashlib.md5(usedforsecurity=False)
        with path.open("rb") as f:
            while chunk := f.read(_READ_CHUNK):
                digest.update(chunk)
        return digest.hexdigest()
    # A multipart ETag depends on the part size the uploader chose: part 1's length tells it.
    part_size = s3.head_object(Bucket=bucket, Key=remote.key, PartNumber=1)["ContentLength"]
    parts = _md5_of_chunks(path, part_size)
    return f"{hashlib.md5(b''.join(parts), usedforsecurity=False).hexdigest()}-{len(parts)}"


def _read_manifest(dest: Path) -> dict[str, str]:
    try:
        data = json.loads((dest / MANIFEST_NAME).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}


def _write_manifest(dest: Path, manifest: dict[str, str]) -> None:
    tmp = dest / (MANIFEST_NAME + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=1, sort_keys=True))
    os.replace(tmp, dest / MANIFEST_NAME)


def _safe_target(dest: Path, relative: str) -> Path:
    target = (dest / relative).resolve()
    if not target.is_relative_to(dest.resolve()):
        raise EngineFetchError(f"object key escapes the destination: {relative!r}")
    return target


def fetch_engine(uri: str, dest: Path, *, s3: S3Client | None = None) -> list[Path]:
    """Make `dest` hold every object under `uri`; returns the local paths. Idempotent."""
    client = s3 if s3 is not None else boto3.client("s3")
    bucket, prefix = parse_s3_uri(uri)
    remote_files = list_engine_files(client, bucket, prefix)
    if not remote_files:
        raise EngineFetchError(f"no objects under {uri}")
    dest.mkdir(parents=True, exist_ok=True)
    manifest = _read_manifest(dest)
    paths: list[Path] = []
    for remote in remote_files:
        target = _safe_target(dest, remote.relative)
        paths.append(target)
        if manifest.get(remote.relative) == remote.etag and target.is_file():
            if target.stat().st_size == remote.size:
                log.info("engine file present", file=remote.relative)
                continue
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(target.name + ".part")
        log.info("downloading engine file", file=remote.relative, bytes=remote.size)
        client.download_file(bucket, remote.key, str(partial))
        size = partial.stat().st_size
        if size != remote.size:
            partial.unlink()
            raise EngineFetchError(f"{remote.relative}: {size} bytes, expected {remote.size}")
        etag = _local_etag(client, bucket, remote, partial)
        if etag != remote.etag:
            partial.unlink()
            raise EngineFetchError(f"{remote.relative}: ETag {etag}, expected {remote.etag}")
        os.replace(partial, target)
        manifest[remote.relative] = remote.etag
        _write_manifest(dest, manifest)
    return paths


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Download a TensorRT-LLM engine from S3.")
    parser.add_argument("uri", help="s3://bucket/prefix/")
    parser.add_argument("dest", type=Path)
    args = parser.parse_args(argv)
    fetch_engine(args.uri, args.dest)


if __name__ == "__main__":
    main()
