"""A checkpoint's text side: tokenizer, chat template and end-of-sequence tokens."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from edge.text.chat_template import ChatTemplate
from edge.text.detokenizer import IncrementalDetokenizer

# Used when a checkpoint ships no template: ChatML, the format of the demo model.
_CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _token_text(value: Any) -> str:
    # tokenizer_config.json stores special tokens either as strings or as AddedToken objects.
    if isinstance(value, dict):
        return str(value.get("content", ""))
    return str(value) if value else ""


def _template_source(config: dict[str, Any]) -> str:
    source = config.get("chat_template")
    if isinstance(source, list):
        named = {item.get("name"): item.get("template") for item in source if isinstance(item, dict)}
        source = named.get("default") or next(iter(named.values()), None)
    return source if isinstance(source, str) and source else _CHATML


class ModelText:
    def __init__(self, tokenizer: Tokenizer, template: ChatTemplate, eos_token_ids: list[int]) -> None:
        self.tokenizer = tokenizer
        self.template = template
        self.eos_token_ids = eos_token_ids

    @classmethod
    def load(cls, model_dir: Path) -> ModelText:
        tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        config_path = model_dir / "tokenizer_config.json"
        config: dict[str, Any] = json.loads(config_path.read_text()) if config_path.exists() else {}
        eos = _token_text(config.get("eos_token"))
        template = ChatTemplate(
            _template_source(config), bos_token=_token_text(config.get("bos_token")), eos_token=eos
        )
        eos_ids = {tid for tid in (tokenizer.token_to_id(eos),) if eos and tid is not None}
        eos_ids.update(_generation_eos_ids(model_dir))
        return cls(tokenizer, template, sorted(eos_ids))

    def encode_chat(self, messages: list[dict[str, str]]) -> list[int]:
        # The template already writes every special token the model expects.
        ids: list[int] = self.tokenizer.encode(self.template.render(messages), add_special_tokens=False).ids
        return ids

    def detokenizer(self) -> IncrementalDetokenizer:
        return IncrementalDetokenizer(self.tokenizer)


def _generation_eos_ids(model_dir: Path) -> list[int]:
    for name in ("generation_config.json", "config.json"):
        path = model_dir / name
        if path.exists():
            value = json.loads(path.read_text()).get("eos_token_id")
            if isinstance(value, int):
                return [value]
            if isinstance(value, list):
                return [int(v) for v in value]
    return []
