"""The model's own chat template (checkpoint/facts.py finds it), rendered in a Jinja sandbox.

Templates ship with checkpoints, so they are untrusted code: the immutable sandbox keeps them
from touching anything but the data they are given. They are written for transformers' renderer,
so they get what it gives them: `raise_exception`, `strftime_now`, the `tojson` filter, the
loop controls ({% break %}, {% continue %}) and the `{% generation %}` block.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime
from typing import Any, Literal

from jinja2 import Environment, TemplateError, nodes
from jinja2.ext import Extension
from jinja2.parser import Parser
from jinja2.sandbox import ImmutableSandboxedEnvironment

# How the rendered prompt ends, as vLLM's request says it: "reply", a new assistant turn opened for
# the model's reply (add_generation_prompt, the default); "as_is", the conversation as it stands
# (add_generation_prompt false); "continue", the final message left open for the model to go on
# with (continue_final_message: an assistant's reply begun by the client, its prefill).
PromptEnd = Literal["reply", "as_is", "continue"]


class ChatTemplateError(Exception):
    """The template rejected the conversation (for example, roles in an order it does not accept)."""


def _raise_exception(message: str) -> None:
    raise ChatTemplateError(message)


def _strftime_now(format: str) -> str:
    # Local time, as transformers renders it: Llama 3.x templates put today's date in the system
    # turn, and fall back to a fixed 2024 date when this is missing.
    return datetime.now().strftime(format)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # transformers' own, argument for argument: templates pass any of them (GLM-4.5's and Qwen
    # 3.5's ensure_ascii=False), and one it did not take failed every render with a TypeError.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


class _GenerationBlock(Extension):
    """`{% generation %}...{% endgeneration %}`: transformers marks the assistant's tokens with it for
    training (TRL's assistant_only_loss), so fine-tuned checkpoints ship templates that hold it.
    Rendering a prompt, it writes its body as it stands, as transformers does; without the tag such
    a template did not parse and its checkpoint could not be served."""

    def __init__(self, environment: Environment) -> None:
        super().__init__(environment)
        # Per instance, as jinja declares it (the parser reads the environment's extensions' tags).
        self.tags = {"generation"}

    def parse(self, parser: Parser) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    @staticmethod
    def _body(caller: Callable[[], str]) -> str:
        return caller()


class ChatTemplate:
    def __init__(self, source: str, *, bos_token: str, eos_token: str) -> None:
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols", _GenerationBlock]
        )
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        env.filters["tojson"] = _tojson
        self._template = env.from_string(source)
        # The template's globals are a ChainMap over the environment's, which every render copies
        # key by key into a new dict (about a sixth of a render). Nothing adds globals after this,
        # so one flat dict of the same names and values renders the same, and copies in one step.
        self._template.globals = dict(self._template.globals)
        self._bos = bos_token
        self._eos = eos_token

    def render(self, messages: list[dict[str, str]], end: PromptEnd = "reply") -> str:
        if end != "continue":
            return self._render(messages, add_generation_prompt=end == "reply")
        final = messages[-1]["content"]
        if not final.strip():
            raise ChatTemplateError("continue_final_message needs a final message with text to continue")
        tagged = [*messages[:-1], {**messages[-1], "content": final + _TAG}]
        return _left_open(self._render(tagged, add_generation_prompt=False), final)

    def _render(self, messages: list[dict[str, str]], *, add_generation_prompt: bool) -> str:
        try:
            return self._template.render(
                messages=messages,
                add_generation_prompt=add_generation_prompt,
                bos_token=self._bos,
                eos_token=self._eos,
            )
        except TemplateError as exc:
            raise ChatTemplateError(str(exc)) from exc
        except (TypeError, ValueError, ArithmeticError, LookupError) as exc:
            # Python's own errors from the template's expressions on these messages (a number added
            # to a string, a division by their count): jinja passes them through as they are, and
            # uncaught they were a 500 for a request the template cannot take.
            raise ChatTemplateError(f"{type(exc).__name__}: {exc}") from exc


# transformers' own tag (apply_chat_template in 4.57 and 5.x, so vLLM's): appended to the final
# message before rendering, the rendering is cut where the template wrote it.
_TAG = "CONTINUE_FINAL_MESSAGE_TAG "


def _left_open(rendered: str, final: str) -> str:
    """The rendering cut right before the tag, as transformers' apply_chat_template(
    continue_final_message=True) cuts it (and so vLLM): whatever the template writes after the final
    message (the turn's end token) is gone, and the model continues the message itself, its
    whitespace as the template wrote it; where the template trimmed the tag's space, the whitespace
    before the tag is trimmed too. The tag is found by its last occurrence (a message may quote it).
    The cut was once found by the final message's own text, stripped, and kept its trailing
    whitespace only where it had none in front (transformers' older rule): a begun reply
    " Here they are:\n" lost its "\n", and a template that changed the message (`upper`) was cut
    inside the end token it wrote after it ("END<|im_end"). A template that drops or changes the
    message leaves nothing to continue: refused rather than cut anywhere."""
    if final.strip() not in rendered or _TAG.strip() not in rendered:
        raise ChatTemplateError(
            "continue_final_message is set but the final message does not appear in the chat the "
            "template rendered: this model's template changes it"
        )
    at = rendered.rindex(_TAG.strip())
    return rendered[:at] if rendered[at : at + len(_TAG)] == _TAG else rendered[:at].rstrip()
