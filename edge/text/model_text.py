"""A checkpoint's text side: tokenizer, chat template, end-of-sequence tokens and the size of its
vocabulary (from its facts)."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from pathlib import Path

from tokenizers import Tokenizer

from edge.text.byte_pieces import byte_pieces
from edge.text.chat_template import ChatTemplate, PromptEnd
from edge.text.content_as_text import ContentAsText
from edge.text.detokenizer import (
    Detokenizer,
    IncrementalDetokenizer,
    LeavingOut,
    PiecesDetokenizer,
    PieceTable,
    special_token_ids,
)
from edge.text.piece_cache import PieceCache
from gpu_container.checkpoint.facts import CheckpointFacts, read_facts


class ModelText:
    def __init__(
        self,
        tokenizer: Tokenizer,
        template: ChatTemplate,
        eos_token_ids: list[int],
        vocab_size: int | None = None,
    ) -> None:
        # A tokenizer.json saved from a training or embedding pipeline can keep its truncation and
        # padding. transformers (so vLLM) turns both off for every call that does not ask for them;
        # kept here, a prompt was cut to max_length (the question gone, answered all the same) or
        # padded after the assistant's turn opened. Off before anything copies the tokenizer.
        if tokenizer.truncation is not None:
            tokenizer.no_truncation()
        if tokenizer.padding is not None:
            tokenizer.no_padding()
        self.tokenizer = tokenizer
        self.template = template
        self.eos_token_ids = eos_token_ids
        # The model's: the width of its logits row (config.json's vocab_size), which a token id a
        # request names (logit_bias) must fall within. It can exceed the tokenizer's count (rows
        # padded for the GPU), so the tokenizer's own is only the fallback without a config.
        self.vocab_size = (
            vocab_size if vocab_size is not None else tokenizer.get_vocab_size(with_added_tokens=True)
        )
        # Built once per model: every stream's detokenizer then reads it (None: not byte-level).
        pieces = byte_pieces(tokenizer)
        self._pieces = PieceTable(pieces) if pieces is not None else None
        self._special_ids = special_token_ids(tokenizer) if self._pieces is None else frozenset()
        # None: this tokenizer's encoding is not its pieces' put together (edge/text/piece_cache.py).
        self._piece_cache = PieceCache.build(tokenizer)
        self._content_as_text = ContentAsText(tokenizer, template)

    @classmethod
    def load(cls, model_dir: Path) -> ModelText:
        """A missing or bad tokenizer.json / tokenizer_config.json raises CheckpointError naming it."""
        return cls.from_facts(read_facts(model_dir))

    @classmethod
    def from_facts(cls, facts: CheckpointFacts) -> ModelText:
        text = facts.text
        template = ChatTemplate(text.chat_template, bos_token=text.bos_token, eos_token=text.eos_token)
        return cls(text.tokenizer, template, list(facts.eos_token_ids), facts.config.vocab_size)

    def encode_chat(
        self, messages: list[dict[str, str]], scope: str = "", end: PromptEnd = "reply"
    ) -> list[int]:
        """The prompt's ids; `scope` is whose kept pieces it may reuse (the request's cache salt);
        `end`, how the prompt ends (edge/text/chat_template.py). A control token's text inside a
        message is encoded as text (edge/text/content_as_text.py)."""
        if self._content_as_text.holds_control_text(messages):
            return self._content_as_text.encode(messages, end)
        # The template already writes every special token the model expects.
        text = self.template.render(messages, end)
        if self._piece_cache is not None:
            return self._piece_cache.encode(text, scope)
        # encode_batch_fast is `encode` without the character offsets of every token, which nothing
        # here reads: 70 against 115 µs of CPU for a one-line chat on a 2-core EPYC.
        (encoding,) = self.tokenizer.encode_batch_fast([text], add_special_tokens=False)
        ids: list[int] = encoding.ids
        return ids

    def detokenizer(
        self, left_out: Collection[int] | None = None, context: Sequence[int] = ()
    ) -> Detokenizer:
        """A stream's detokenizer; `left_out`: tokens whose text it leaves out (a request's
        stop_token_ids); `context`: the prompt a continued message's reply goes on from (a byte
        piece's text does not depend on what comes before it, so only the window reads it)."""
        detok: Detokenizer
        if self._pieces is not None:
            detok = PiecesDetokenizer(self._pieces)
        else:
            detok = IncrementalDetokenizer(self.tokenizer, special_ids=self._special_ids, context=context)
        return LeavingOut(detok, frozenset(left_out)) if left_out else detok
