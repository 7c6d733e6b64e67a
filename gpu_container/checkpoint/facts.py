"""The one reader of a checkpoint directory's facts: architecture, EOS ids, BOS, context length,
chat template, special tokens, weight files. The engine, the edge and the Triton upstream all ask
here, so they agree; a missing or bad file is an error that names it.

A Hugging Face-style checkpoint directory holds config.json, one or more *.safetensors, and for
the text side tokenizer.json (+ tokenizer_config.json, generation_config.json when present; the chat
template in tokenizer_config.json, else chat_template.jinja, else chat_templates/default.jinja). An
engine-only directory (no tokenizer.json) has facts too, and so has an edge's weightless copy
(config and tokenizer files only); asking either for what it lacks fails, naming the file.

End of sequence, one rule: config.json's `eos_token_id` (an int or a list), then
generation_config.json's (as HF generate does), then tokenizer_config.json's `eos_token`; in that
order, without repeats. TensorRT-LLM takes one of them as its `end_id` (`end_id`, below), the others
as stop words: the tokenizer's own `eos_token`, as tensorrtllm_backend's preprocessing model takes
it, else the first. They differ where it matters: Llama 3.1 Instruct's config.json lists
<|end_of_text|> first, while its tokenizer's eos_token is <|eot_id|>, the token that ends a chat
turn, which `min_length` (vLLM's min_tokens) must hold back.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog
from tokenizers import Tokenizer

from gpu_container.checkpoint.errors import CheckpointError, UnsupportedModel
from gpu_container.engine.llama_config import LlamaConfig

CONFIG = "config.json"
GENERATION_CONFIG = "generation_config.json"
TOKENIZER = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
# Where transformers (since 4.47 or so) saves the template instead of in tokenizer_config.json.
TEMPLATE_FILES = ("chat_template.jinja", "chat_templates/default.jinja")

log = structlog.get_logger(__name__)

# Used when a checkpoint ships no template: ChatML, the format of the demo model.
CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@dataclass(frozen=True, slots=True)
class TextFacts:
    tokenizer: Tokenizer
    chat_template: str
    bos_token: str
    eos_token: str
    special_tokens: tuple[str, ...]  # tokenizer.json's added tokens marked special


@dataclass(frozen=True, slots=True)
class CheckpointFacts:
    directory: Path
    config: LlamaConfig  # its eos_token_ids follow the one rule above
    text_facts: TextFacts | None

    @property
    def weight_files(self) -> tuple[Path, ...]:
        """Asked only by what loads weights: an edge in front of remote replicas holds none."""
        files = tuple(sorted(self.directory.glob("*.safetensors")))
        if not files:
            raise CheckpointError(f"{self.directory}: no *.safetensors weight file")
        return files

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        return self.config.eos_token_ids

    @property
    def end_id(self) -> int | None:
        """The end token TensorRT-LLM's `end_id` takes (the module's doc): the tokenizer's eos_token
        (read_facts put it among the end tokens), else the first end token."""
        text = self.text_facts
        if text is not None and text.eos_token:
            own = text.tokenizer.token_to_id(text.eos_token)
            if own is not None:
                return int(own)
        return self.eos_token_ids[0] if self.eos_token_ids else None

    @property
    def max_context(self) -> int:
        return self.config.max_position_embeddings

    @property
    def text(self) -> TextFacts:
        if self.text_facts is None:
            raise CheckpointError(f"{self.directory / TOKENIZER}: missing (the checkpoint has no tokenizer)")
        return self.text_facts


def read_facts(directory: str | Path) -> CheckpointFacts:
    directory = Path(directory)
    if not directory.is_dir():
        raise CheckpointError(f"{directory}: no such checkpoint directory")
    raw = _json(directory / CONFIG, required=True)
    generation = _json(directory / GENERATION_CONFIG, required=False)
    tokenizer_config = _json(directory / TOKENIZER_CONFIG, required=False)
    text = _text_facts(directory, tokenizer_config)
    eos = _ids(raw.get("eos_token_id")) + _ids(generation.get("eos_token_id"))
    if text is not None and text.eos_token:
        eos_id = text.tokenizer.token_to_id(text.eos_token)
        if eos_id is None:
            raise CheckpointError(
                f"{directory / TOKENIZER_CONFIG}: eos_token {text.eos_token!r} is not in the vocabulary"
            )
        eos.append(int(eos_id))
    try:
        config = LlamaConfig.from_hf(raw, eos_token_ids=tuple(dict.fromkeys(eos)))
    except KeyError as exc:
        raise CheckpointError(f"{directory / CONFIG}: missing key {exc}") from None
    except (TypeError, ValueError) as exc:
        raise UnsupportedModel(f"{directory / CONFIG}: {exc}") from None
    return CheckpointFacts(directory, config, text)


def _text_facts(directory: Path, config: dict[str, Any]) -> TextFacts | None:
    path = directory / TOKENIZER
    if not path.is_file():
        return None
    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises a bare Exception on a bad file
        raise CheckpointError(f"{path}: not a readable tokenizer: {exc}") from None
    specials = tuple(t.content for t in tokenizer.get_added_tokens_decoder().values() if t.special)
    return TextFacts(
        tokenizer=tokenizer,
        chat_template=_template_source(directory, config),
        bos_token=_token_text(config.get("bos_token")),
        eos_token=_token_text(config.get("eos_token")),
        special_tokens=specials,
    )


def _json(path: Path, *, required: bool) -> dict[str, Any]:
    if not path.is_file():
        if required:
            raise CheckpointError(
                f"{path}: missing (a checkpoint directory needs {CONFIG} and *.safetensors)"
            )
        return {}
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise CheckpointError(f"{path}: not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise CheckpointError(f"{path}: expected a JSON object, found {type(value).__name__}")
    return value


def _ids(value: Any) -> list[int]:
    if isinstance(value, int):
        return [value]
    return [int(v) for v in value] if isinstance(value, list) else []


def _token_text(value: Any) -> str:
    # tokenizer_config.json stores special tokens either as strings or as AddedToken objects.
    if isinstance(value, dict):
        return str(value.get("content", ""))
    return str(value) if value else ""


def _template_source(directory: Path, config: dict[str, Any]) -> str:
    source = config.get("chat_template")
    if isinstance(source, list):
        named = {item.get("name"): item.get("template") for item in source if isinstance(item, dict)}
        source = named.get("default") or next(iter(named.values()), None)
    if isinstance(source, str) and source:
        return source
    for name in TEMPLATE_FILES:
        path = directory / name
        if path.is_file():
            try:
                text = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                raise CheckpointError(f"{path}: not a readable template: {exc}") from None
            if text:
                return text
    # ChatML may not be the model's format at all: a reply in the wrong format is quiet, so say it.
    log.warning(
        "checkpoint has no chat template; serving ChatML",
        directory=str(directory),
        looked_in=[TOKENIZER_CONFIG, *TEMPLATE_FILES],
    )
    return CHATML
