"""The model's own chat template (tokenizer_config.json), rendered in a Jinja sandbox.

Templates ship with checkpoints, so they are untrusted code: the immutable sandbox keeps them
from touching anything but the data they are given.
"""

from __future__ import annotations

import json
from typing import Any

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment


class ChatTemplateError(Exception):
    """The template rejected the conversation (for example, roles in an order it does not accept)."""


def _raise_exception(message: str) -> None:
    raise ChatTemplateError(message)


def _tojson(value: Any, indent: int | None = None) -> str:
    return json.dumps(value, ensure_ascii=False, indent=indent)


class ChatTemplate:
    def __init__(self, source: str, *, bos_token: str, eos_token: str) -> None:
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = _raise_exception
        env.filters["tojson"] = _tojson
        self._template = env.from_string(source)
        # The template's globals are a ChainMap over the environment's, which every render copies
        # key by key into a new dict (about a sixth of a render). Nothing adds globals after this,
        # so one flat dict of the same names and values renders the same, and copies in one step.
        self._template.globals = dict(self._template.globals)
        self._bos = bos_token
        self._eos = eos_token

    def render(self, messages: list[dict[str, str]]) -> str:
        try:
            return self._template.render(
                messages=messages, add_generation_prompt=True, bos_token=self._bos, eos_token=self._eos
            )
        except TemplateError as exc:
            raise ChatTemplateError(str(exc)) from exc
