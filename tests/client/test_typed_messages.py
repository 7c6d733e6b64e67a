"""The messages the client's annotations take are the messages the edge takes: OpenAI's content parts
(a list of `{"type": "text", "text": ...}`) and the openai package's own typed messages. Annotated
`Mapping[str, str]`, an application's mypy refused both, which the edge answers (README: a text part
is read as its text); the call ran, the type check failed."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.structure.imports import ROOT
from tests.support.live_server import LiveServer

# Type-checked as an application would (strict), then run against the edge.
APPLICATION = textwrap.dedent(
    """
    from openai.types.chat import ChatCompletionMessageParam

    from floodgate_client import Client


    def ask(base_url: str, api_key: str) -> tuple[str, str]:
        parts = [{"role": "user", "content": [{"type": "text", "text": "Hello"}]}]
        typed: list[ChatCompletionMessageParam] = [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Hello"}]},
        ]
        with Client(base_url, api_key) as fg:
            # Greedy: a sampled reply of two tokens may end at an end token (finish_reason "stop").
            with fg.chat.stream(parts, max_tokens=2, temperature=0) as stream:
                first = stream.until_finished().reason
            second = fg.chat.create(typed, max_tokens=2, temperature=0).finish_reason
        return first, second
    """
)


def test_content_parts_and_the_sdks_typed_messages_type_check_and_are_answered(
    server: LiveServer, tmp_path: Path
) -> None:
    pytest.importorskip("openai", reason="the openai package's typed messages")
    source = tmp_path / "application.py"
    source.write_text(APPLICATION)
    checked = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--cache-dir", str(tmp_path / "cache"), str(source)],
        capture_output=True,
        text=True,
        timeout=300,
        # This checkout's client, not an installed copy.
        env={**os.environ, "MYPYPATH": str(ROOT / "client")},
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    namespace: dict[str, object] = {}
    exec(compile(APPLICATION, str(source), "exec"), namespace)
    ask = namespace["ask"]
    assert callable(ask)
    assert ask(server.base_url, server.keys["paid"]) == ("length", "length")
