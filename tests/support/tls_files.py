"""A throwaway certificate authority and a server certificate for 127.0.0.1 and localhost, written
to a directory, for servers the tests start with TLS (redis-server --tls-port). trustme makes them:
nothing here is a secret or outlives the test run."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import trustme


@dataclass(frozen=True)
class TlsFiles:
    ca: Path  # the CA certificate a client trusts
    cert: Path  # the server's certificate
    key: Path  # the server's private key


def make_tls_files(directory: Path, *, names: tuple[str, ...] = ("127.0.0.1", "localhost")) -> TlsFiles:
    ca = trustme.CA()
    server = ca.issue_cert(*names)
    files = TlsFiles(ca=directory / "ca.pem", cert=directory / "cert.pem", key=directory / "key.pem")
    ca.cert_pem.write_to_path(str(files.ca))
    server.cert_chain_pems[0].write_to_path(str(files.cert))
    server.private_key_pem.write_to_path(str(files.key))
    return files
