"""`floodgate keys import --secret-id`: the keys from AWS Secrets Manager (moto here), in a module
of its own, since a module holding moto's starter makes each of its tests a server test."""

from __future__ import annotations

from pathlib import Path

import pytest

from edge.cli import main
from tests.support.moto_server import REGION, running_moto

NOT_FOUND = r"^floodgate: cannot read the secret 'nope': .*ResourceNotFound"


def test_import_of_a_missing_secret_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """botocore's ResourceNotFoundException was a traceback."""
    config = tmp_path / "floodgate.toml"
    config.write_text(
        f'[server]\nkeys_file = "{tmp_path / "keys.jsonl"}"\n[keys]\nsqlite_path = "{tmp_path / "keys.db"}"\n'
    )
    with running_moto() as endpoint:
        monkeypatch.setenv("AWS_ENDPOINT_URL_SECRETS_MANAGER", endpoint)
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
        monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
        with pytest.raises(SystemExit, match=NOT_FOUND):
            main(["keys", "import", "--secret-id", "nope", "--config", str(config)])
