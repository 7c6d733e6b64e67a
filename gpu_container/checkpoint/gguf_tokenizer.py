"""tokenizer.json and tokenizer_config.json from a GGUF's `tokenizer.ggml.*` metadata.

Only gpt2-style byte-level BPE is built, with the pre-tokenizer llama.cpp uses for the file's
`tokenizer.ggml.pre` (llama-vocab.cpp's regexes): `gpt2` is byte-level with GPT-2's split, `smollm`
first splits digits one per token. Any other vocabulary or pre-tokenizer is refused by name:
a near miss would tokenize differently from the model's training and nothing would say so.
Token types say which tokens are special: CONTROL ones (<|im_start|>...) are matched whole and
skipped when decoding; USER_DEFINED ones are matched whole and kept.
"""

from __future__ import annotations

from typing import Any

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

from gpu_container.checkpoint.errors import UnsupportedModel
from gpu_container.checkpoint.gguf_file import GgufFile

_CONTROL = 3
_USER_DEFINED = 4
_BYTE_LEVEL = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
_PRE_TOKENIZERS: dict[str, pre_tokenizers.PreTokenizer] = {
    "gpt2": _BYTE_LEVEL,
    "smollm": pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), _BYTE_LEVEL]),
}


def build_tokenizer(gguf: GgufFile) -> Tokenizer:
    kind = gguf.require("tokenizer.ggml.model")
    if kind != "gpt2":
        raise UnsupportedModel(
            f"{gguf.path}: tokenizer.ggml.model {kind!r} is not supported (only 'gpt2' BPE)"
        )
    pre = gguf.value("tokenizer.ggml.pre", "default")
    if pre not in _PRE_TOKENIZERS:
        known = ", ".join(sorted(_PRE_TOKENIZERS))
        raise UnsupportedModel(f"{gguf.path}: tokenizer.ggml.pre {pre!r} is not supported (known: {known})")
    tokens: list[str] = list(gguf.require("tokenizer.ggml.tokens"))
    merges = [tuple(merge.split(" ", 1)) for merge in gguf.require("tokenizer.ggml.merges")]
    tokenizer = Tokenizer(
        models.BPE(vocab={token: i for i, token in enumerate(tokens)}, merges=merges, fuse_unk=False)
    )
    tokenizer.pre_tokenizer = _PRE_TOKENIZERS[pre]
    tokenizer.decoder = decoders.ByteLevel()
    types: list[int] = list(gguf.value("tokenizer.ggml.token_type", []))
    tokenizer.add_special_tokens(
        [AddedToken(tokens[i], special=True, normalized=False) for i, t in enumerate(types) if t == _CONTROL]
    )
    tokenizer.add_tokens(
        [
            AddedToken(tokens[i], special=False, normalized=False)
            for i, t in enumerate(types)
            if t == _USER_DEFINED
        ]
    )
    tokenizer.post_processor = _post_processor(gguf, tokens)
    return tokenizer


def _post_processor(gguf: GgufFile, tokens: list[str]) -> processors.PostProcessor:
    """BOS/EOS added to plain text exactly when llama.cpp adds them (add_bos_token/add_eos_token).
    Chat prompts are encoded without them: the template writes every special token itself."""
    before: list[str] = []
    after: list[str] = []
    specials: list[tuple[str, int]] = []
    for flag, key, side in (
        ("add_bos_token", "bos_token_id", before),
        ("add_eos_token", "eos_token_id", after),
    ):
        token_id = gguf.value(f"tokenizer.ggml.{key}")
        if gguf.value(f"tokenizer.ggml.{flag}", False) and token_id is not None:
            side.append(tokens[int(token_id)])
            specials.append((tokens[int(token_id)], int(token_id)))
    if not specials:
        return processors.ByteLevel(trim_offsets=False)
    single = " ".join([*before, "$A", *after])
    pair = " ".join([*before, "$A", *after, *before, "$B:1", *after])
    return processors.TemplateProcessing(
        single=single, pair=pair, special_tokens=list(dict.fromkeys(specials))
    )


def tokenizer_config(gguf: GgufFile) -> dict[str, Any]:
    tokens: list[str] = list(gguf.require("tokenizer.ggml.tokens"))

    def token(key: str) -> str | None:
        token_id = gguf.value(f"tokenizer.ggml.{key}")
        return None if token_id is None else tokens[int(token_id)]

    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": token("bos_token_id"),
        "eos_token": token("eos_token_id"),
        "unk_token": token("unknown_token_id"),
        "pad_token": token("padding_token_id"),
        "add_bos_token": bool(gguf.value("tokenizer.ggml.add_bos_token", False)),
        "add_eos_token": bool(gguf.value("tokenizer.ggml.add_eos_token", False)),
        "clean_up_tokenization_spaces": False,
        "model_max_length": int(gguf.value("llama.context_length", 2048)),
    }
    template = gguf.value("tokenizer.chat_template")
    if template:
        config["chat_template"] = str(template)
    return config
