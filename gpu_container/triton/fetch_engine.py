"""Move a built TensorRT-LLM engine between a local folder and S3, verified by SHA-256.

    python -m gpu_container.triton.fetch_engine s3://bucket/engines/llama-3-8b/ /engines/model

Why not ETags: S3's ETag is the MD5 of the data only for unencrypted or SSE-S3 single-part
uploads. The engine bucket is SSE-KMS, whose ETags are not MD5s of anything the host can compute,
so a check against them fails every file. Integrity comes from SHA-256 instead, at both ends:

* `upload_engine` uploads every file with `ChecksumAlgorithm=SHA256` (S3 verifies each part as it
  arrives and stores the checksum), then writes `ENGINE_MANIFEST` (relative path -> size and
  SHA-256 of the whole file) last, so a prefix whose upload did not finish has no manifest;
* `fetch_engine` reads the manifest, downloads each file with `ChecksumMode=ENABLED` (botocore
  checks S3's stored checksum where the response carries a whole-object one) and compares the
  file's own SHA-256 with the manifest's, whatever the encryption or the part size.

A local record beside the files (`LOCAL_RECORD`) keeps what was verified, so a restarted container
skips those files.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import boto3
import structlog
from botocore.exceptions import ClientError

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

log = structlog.get_logger(__name__)

ENGINE_MANIFEST = "floodgate-engine.sha256.json"
LOCAL_RECORD = ".floodgate-engine.json"
_READ_CHUNK = 1 << 20


class EngineFetchError(RuntimeError):
    """No manifest under the prefix, or a downloaded file does not match it."""


@dataclass(frozen=True, slots=True)
class EngineFile:
    relative: str
    size: int
    sha256: str


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


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_READ_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _client(s3: S3Client | None) -> S3Client:
    return s3 if s3 is not None else boto3.client("s3")


def upload_engine(engine_dir: Path, uri: str, *, s3: S3Client | None = None) -> list[EngineFile]:
    """Upload every file of `engine_dir` under `uri`, then the manifest naming them all."""
    client = _client(s3)
    bucket, prefix = parse_s3_uri(uri)
    files: list[EngineFile] = []
    for path in sorted(p for p in engine_dir.rglob("*") if p.is_file()):
        relative = path.relative_to(engine_dir).as_posix()
        if relative in (ENGINE_MANIFEST, LOCAL_RECORD):
            continue
        entry = EngineFile(relative, path.stat().st_size, sha256_of(path))
        log.info("uploading engine file", key=prefix + relative, bytes=entry.size)
        client.upload_file(str(path), bucket, prefix + relative, ExtraArgs={"ChecksumAlgorithm": "SHA256"})
        files.append(entry)
    if not files:
        raise EngineFetchError(f"no files in {engine_dir}")
    manifest = {"files": {f.relative: {"size": f.size, "sha256": f.sha256} for f in files}}
    client.put_object(
        Bucket=bucket,
        Key=prefix + ENGINE_MANIFEST,
        Body=json.dumps(manifest, indent=1, sort_keys=True).encode(),
        ContentType="application/json",
        ChecksumAlgorithm="SHA256",
    )
    return files


def read_manifest(s3: S3Client, bucket: str, prefix: str) -> list[EngineFile]:
    try:
        answer = s3.get_object(Bucket=bucket, Key=prefix + ENGINE_MANIFEST, ChecksumMode="ENABLED")
    except ClientError as exc:
        upload = (
            "upload the engine with `python3 -m gpu_container.triton.build_engine ... --upload` (it "
            "writes the manifest last)"
        )
        code = exc.response.get("Error", {}).get("Code")
        if code in ("NoSuchKey", "404"):
            raise EngineFetchError(f"no {ENGINE_MANIFEST} under s3://{bucket}/{prefix}: {upload}") from None
        if code in ("AccessDenied", "403"):
            # S3 answers a missing object with 403, not 404, to a reader that may not list the
            # bucket, and the host's role may only read the engine's objects (iac/modules/gpu_pool/
            # iam.tf): so this is most often an engine never uploaded, and only then a grant.
            raise EngineFetchError(
                f"{ENGINE_MANIFEST} under s3://{bucket}/{prefix} is missing or this host may not read "
                f"it (403): {upload}; if it is there, check the host role's s3:GetObject on the prefix "
                "and kms:Decrypt on the bucket's key"
            ) from None
        raise
    data: Any = json.loads(answer["Body"].read())
    files = data.get("files") if isinstance(data, dict) else None
    if not isinstance(files, dict) or not files:
        raise EngineFetchError(f"{ENGINE_MANIFEST} under s3://{bucket}/{prefix} lists no files")
    return [EngineFile(str(k), int(v["size"]), str(v["sha256"])) for k, v in sorted(files.items())]


def _read_record(dest: Path) -> dict[str, str]:
    try:
        data = json.loads((dest / LOCAL_RECORD).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}


def _write_record(dest: Path, record: dict[str, str]) -> None:
    tmp = dest / (LOCAL_RECORD + ".tmp")
    tmp.write_text(json.dumps(record, indent=1, sort_keys=True))
    os.replace(tmp, dest / LOCAL_RECORD)


def _safe_target(dest: Path, relative: str) -> Path:
    target = (dest / relative).resolve()
    if not target.is_relative_to(dest.resolve()):
        raise EngineFetchError(f"manifest path escapes the destination: {relative!r}")
    return target


def _remove_leftovers(target: Path) -> None:
    """Delete what an interrupted download of `target` left: our `NAME.part` and the temporary file
    boto3's transfer writes it through (`NAME.part.` and 8 random letters or digits), which it
    deletes only when the download fails in the process, not when the process is killed. A
    container stopped while it fetched (killed at Docker's stop timeout) left one of these on the
    host's engine volume, as large as the file it was fetching, and every restart's fetch wrote a
    new one beside it: the next interruption, or an engine larger than half the disk, and the fetch
    ran out of space on every start."""
    leftover = re.compile(re.escape(target.name) + r"\.part(\.[A-Za-z0-9]{8})?")
    if not target.parent.is_dir():
        return
    for path in target.parent.iterdir():
        if leftover.fullmatch(path.name) and path.is_file():
            log.info("removing an interrupted download", file=path.name, bytes=path.stat().st_size)
            path.unlink()


def fetch_engine(uri: str, dest: Path, *, s3: S3Client | None = None) -> list[Path]:
    """Make `dest` hold every file the manifest under `uri` lists; returns their paths. Idempotent,
    and an interrupted fetch's partial files are removed before anything is downloaded."""
    client = _client(s3)
    bucket, prefix = parse_s3_uri(uri)
    files = read_manifest(client, bucket, prefix)
    dest.mkdir(parents=True, exist_ok=True)
    for entry in files:
        _remove_leftovers(_safe_target(dest, entry.relative))
    record = _read_record(dest)
    paths: list[Path] = []
    for entry in files:
        target = _safe_target(dest, entry.relative)
        paths.append(target)
        verified = record.get(entry.relative) == entry.sha256
        if verified and target.is_file() and target.stat().st_size == entry.size:
            log.info("engine file present", file=entry.relative)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(target.name + ".part")
        log.info("downloading engine file", file=entry.relative, bytes=entry.size)
        try:
            client.download_file(
                bucket, prefix + entry.relative, str(partial), ExtraArgs={"ChecksumMode": "ENABLED"}
            )
            size, digest = partial.stat().st_size, sha256_of(partial)
        except ClientError as exc:
            raise EngineFetchError(f"{entry.relative}: in the manifest, not downloadable: {exc}") from exc
        except BaseException:
            # Stopped (the entrypoint's SIGTERM) or failed while downloading or hashing: a partial
            # file as large as the engine's would stay on the host's volume.
            partial.unlink(missing_ok=True)
            raise
        if (size, digest) != (entry.size, entry.sha256):
            partial.unlink()
            raise EngineFetchError(
                f"{entry.relative}: {size} bytes with SHA-256 {digest}, "
                f"the manifest says {entry.size} bytes with {entry.sha256}"
            )
        os.replace(partial, target)
        record[entry.relative] = entry.sha256
        _write_record(dest, record)
    return paths


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Download a TensorRT-LLM engine from S3, SHA-256 verified.")
    parser.add_argument("uri", help="s3://bucket/prefix/ (holds floodgate-engine.sha256.json)")
    parser.add_argument("dest", type=Path)
    args = parser.parse_args(argv)
    fetch_engine(args.uri, args.dest)


if __name__ == "__main__":
    main()
