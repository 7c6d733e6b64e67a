"""The chat completions request as clients send it, decoded and checked in one msgspec pass.

Unknown fields are ignored (clients send many we do not use); wrong types and out-of-range values
become a 400 naming the parameter. Every number is bounded the way the OpenAI API bounds it, so a
value the replica cannot take is refused here, for this request only, and never reaches a replica
(where it would fail a generation and make the replica look broken to everyone else).

`presence_penalty`, `frequency_penalty` and `logit_bias` reach the replica
(gpu_container/engine/sampler.py; TensorRT-LLM's inputs of the same names, and its `embedding_bias`
for logit_bias). Here a logit_bias key must be an integer and its bias a number (vLLM's float) within
[-100, 100]; whether the key is one of this model's token ids only the pipeline knows, which holds the
model's vocabulary (edge/pipeline.py) and refuses it with a 400 naming `logit_bias` too. vLLM's `top_k` and
`repetition_penalty` extensions reach it as well (TensorRT-LLM's `runtime_top_k` and
`repetition_penalty`), and so do its ways to say how a reply ends: `ignore_eos` (TensorRT-LLM's
end_id -1), `min_tokens` (its `min_length`) and `stop_token_ids` (its `stop_words_list`). Those the
pipeline checks against the request and the model too: min_tokens against the max_tokens it gets,
each stop token id against the vocabulary, each a 400 naming it. `include_stop_str_in_output`
keeps the stop string (or stop token's text) that ended the reply at the end of its text, as vLLM
does; the edge matches stop strings (edge/text/stops.py). `continue_final_message` (with
`add_generation_prompt` false, as vLLM requires) continues the final message instead of opening a
new turn, and `add_generation_prompt` false alone renders the conversation as it stands: the edge
renders the chat template (edge/text/chat_template.py). Other fields OpenAI does not define are
ignored.

What would change the reply's contract is refused rather than ignored, as vLLM refuses it without a
tool parser or structured output: `n` > 1, `logprobs`, a reply held to JSON (`response_format` other
than text, or vLLM's own structured outputs: `guided_json`, `guided_choice`, `guided_regex`,
`guided_grammar`, `structural_tag`, `structured_outputs`, and `guided_decoding_backend` /
`guided_whitespace_pattern` that tune them), tool calls (`tools` or `functions` the model may call,
a `tool_choice` that asks for one), an audio reply (`modalities` other than "text", `audio`), a web search
(`web_search_options`) and a moderated completion (`moderation`: nothing here runs a moderation
model, blocks a flagged prompt or reply, or answers its results), and a reasoning effort or
verbosity other than what this model does anyway (`reasoning_effort` "none", `verbosity` "medium":
a client asking for "high" effort or a "low" verbosity would otherwise take an ordinary reply for
the one it asked for), as OpenAI refuses them for a model without them, and vLLM's extensions
neither replica applies (VLLM_UNAPPLIED: `min_p`, `bad_words`, beam search, ...). A client that
parses the reply as JSON, waits for a tool call or plays the audio would otherwise get prose, and
fail later and further away. Each is refused only when sent with a value: null, as clients that fill every
field send it, asks for nothing (and `modalities` ["text"] asks for what there is).

So is a message's content part other than text (an image, audio, a file): the model reads text
only, and would answer about what it never saw.

`logprobs` stays refused although the in-process engine could compute them: TensorRT-LLM's Triton
backend, the production replicas, returns the log-probability under the distribution it sampled
from, after temperature and top-k, so every token of a greedy reply reads 0 (tensorrtllm_backend
issue 276), and no alternatives (`top_logprobs`). OpenAI's are the model's own; zeros in their
place would mislead a client that ranks or thresholds on them, where a 400 tells it at once.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, get_args

import msgspec

from edge.errors import ApiError, invalid_request, quoted_values_shown, shown
from edge.float32 import FLOAT32_MIN_NORMAL
from edge.text.chat_template import PromptEnd

# "function": the deprecated reply to a `function_call` (before tool calls), which OpenAI and vLLM
# still take (with its `name`); a client replaying an old conversation got a 400 for it. The chat
# template gets it as it is, as vLLM's does: a template that knows no such role says so (a 400).
Role = Literal["system", "developer", "user", "assistant", "tool", "function"]

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
# OpenAI answers 400 "array too long" above 2048 messages. The chat template runs once per message,
# so this also bounds the template's work by something other than the body size.
MAX_MESSAGES = 2048
MAX_STOP_SEQUENCES = 4
MAX_LOGIT_BIAS_ENTRIES = 300
# A model has a handful of end tokens; the engine looks each generated token up among them, and
# TensorRT-LLM's stop-word check walks them at every step.
MAX_STOP_TOKEN_IDS = 64
# The one processing tier the replicas serve (OpenAI's standard one): no flex, scale or priority.
SERVED_TIER = "default"

Int64 = Annotated[int, msgspec.Meta(ge=INT64_MIN, le=INT64_MAX)]
TokenCount = Annotated[int, msgspec.Meta(ge=1, le=INT64_MAX)]
Penalty = Annotated[float, msgspec.Meta(ge=-2.0, le=2.0)]
# A float, as vLLM takes it (dict[str, float]); OpenAI's spec says integer, which JSON Schema reads
# as any number without a fraction, so a client's `5.0` is one too. Within OpenAI's [-100, 100].
Bias = Annotated[float, msgspec.Meta(ge=-100.0, le=100.0)]


class ContentPart(msgspec.Struct):
    type: str
    text: str | None = None
    # An assistant message's refusal part (OpenAI's `{"type": "refusal", "refusal": ...}`).
    refusal: str | None = None

    def words(self) -> str | None:
        """What a text model reads of it: a part carries its text in the field named as its type."""
        return self.text if self.type == "text" else self.refusal


# The parts a text model can read (_check_content_parts refuses the others).
_READABLE_PARTS = ("text", "refusal")


# No parts at all is an empty turn (_check_content_parts). For the document alone: the check's
# message is OpenAI's, which msgspec's would not be.
ContentParts = Annotated[list[ContentPart], msgspec.Meta(extra_json_schema={"minItems": 1})]


class ChatMessage(msgspec.Struct):
    role: Role
    # UNSET tells a message sent without content from one whose content is null: OpenAI names the
    # first a missing parameter and the second a wrong type (_check_content).
    content: str | ContentParts | msgspec.UnsetType | None = msgspec.UNSET
    # The participant (OpenAI's optional `name`; a function message's function, required there),
    # stored with a named conversation's turn so its history says who spoke, and given to the chat
    # template with the message, as vLLM gives it (edge/pipeline.py). Bounded as `user` is: it is
    # kept with the turn (a DynamoDB item leaves a few KB beside the content,
    # edge/messages/dynamodb.py).
    name: Annotated[str, msgspec.Meta(max_length=256)] | None = None
    # An assistant's refusal as OpenAI answers it (content null, `refusal` its text), replayed by a
    # client with its history: the model reads it as that turn's text, as it reads a refusal part.
    refusal: str | None = None

    def text(self) -> str:
        if self.content is None or self.content is msgspec.UNSET:
            return self.refusal or ""
        if isinstance(self.content, str):
            return self.content
        return "\n".join(part.words() or "" for part in self.content)


class StreamOptions(msgspec.Struct):
    include_usage: bool | None = False  # null as in OpenAI's spec: false
    # vLLM's usage in every chunk: not sent, so refused when asked for (parse_chat_request).
    continuous_usage_stats: bool | None = None


class ResponseFormat(msgspec.Struct):
    type: Literal["text", "json_object", "json_schema"]


# "none", "auto", "required", or {"type": "function", "function": {"name": ...}}.
ToolChoice = str | dict[str, Any]


# A field decoded only to be refused by name when it holds anything but null (the OpenAPI document,
# edge/openapi.py, says so).
Refused = Annotated[
    Any, msgspec.Meta(description="vLLM's structured outputs: not supported, a 400 unless null")
]
RefusedOutput = Annotated[
    Any,
    msgspec.Meta(
        description="Audio replies, web search and moderated completions: not supported, a 400 unless null"
    ),
]
RefusedSampling = Annotated[
    Any,
    msgspec.Meta(
        description="vLLM's extension: not applied here, a 400 when it asks for anything (null, "
        "false, 0, an empty list or best_of 1 ask for nothing; for skip_special_tokens and "
        "spaces_between_special_tokens, null or true)"
    ),
]


# One path segment of the history's URL (GET /v1/conversations/{id}/messages): an id with a '/'
# (or none at all) would be stored where no request could read it back, and so would "." and "..",
# which clients resolve away before sending the URL (RFC 3986's dot segments: httpx and browsers
# ask for /v1/conversations/messages or /v1/messages instead).
MAX_CONVERSATION_ID = 256
ConversationId = Annotated[
    str, msgspec.Meta(min_length=1, max_length=MAX_CONVERSATION_ID, pattern=r"^(?!\.\.?$)[^/]+$")
]


# _check_content's rule for each role, for the OpenAPI document (edge/openapi.py), which said any
# message may leave its content out: a tool message without it (which OpenAI refuses too, its
# content being the tool's result) was documented as valid and answered 400. Only an assistant's
# may; a function's may be null but must be there, and name its function.
_CONTENT_BY_ROLE = {
    "anyOf": [
        {"properties": {"role": {"const": "assistant"}}},
        {
            "properties": {
                "role": {"enum": [r for r in get_args(Role) if r not in ("assistant", "function")]},
                "content": {"type": ["string", "array"]},
            },
            "required": ["content"],
        },
        {
            "properties": {"role": {"const": "function"}, "name": {"type": "string"}},
            "required": ["content", "name"],
        },
    ]
}
DocumentedMessage = Annotated[ChatMessage, msgspec.Meta(extra_json_schema=_CONTENT_BY_ROLE)]


class ChatCompletionRequest(msgspec.Struct):
    messages: Annotated[list[DocumentedMessage], msgspec.Meta(min_length=1, max_length=MAX_MESSAGES)]
    # Left out or null, as vLLM takes it (its default model), or empty: the key's tier's default
    # model (edge/models/catalog.py). Required, a client written for vLLM got a 400 for naming none.
    model: str | None = None
    # null as in OpenAI's spec (and vLLM): not streamed. Clients that fill every field send it.
    stream: bool | None = False
    max_tokens: TokenCount | None = None
    max_completion_tokens: TokenCount | None = None
    temperature: Annotated[float, msgspec.Meta(ge=0.0, le=2.0)] | None = None
    # 0 to 1 as OpenAI takes it (vLLM refuses 0, which code written for OpenAI sends beside a
    # temperature of 0); a replica is sent replica_top_p.
    top_p: Annotated[float, msgspec.Meta(ge=0.0, le=1.0)] | None = None
    # vLLM's extension (clients send it in the openai SDK's extra_body): sample among the k most
    # likely tokens; 0 or -1 is off. Bounded by TensorRT-LLM's top-k sampling, which takes k <= 1024.
    top_k: Annotated[int, msgspec.Meta(ge=-1, le=1024)] | None = None
    # vLLM's extension too: a logit of a token the prompt or the reply holds is divided by it when
    # positive, multiplied when negative (1 is off). Above 0 as vLLM takes it, and at least float32's
    # smallest normal number: both replicas hold it in float32, where a smaller one is 0 or denormal.
    repetition_penalty: Annotated[float, msgspec.Meta(ge=FLOAT32_MIN_NORMAL, le=10.0)] | None = None
    # vLLM's extensions for how a reply ends. ignore_eos: generate past the model's end tokens
    # (stop strings, stop_token_ids and max_tokens still end it, the last as "length").
    # Null, as clients that fill every field send it, is the default (`ignore_eos`): these four
    # were the only fields a null was a 400 for. Decoded under another attribute name, so that the
    # property of the field's own name reads as a plain bool.
    ignore_eos_sent: bool | None = msgspec.field(default=None, name="ignore_eos")
    # No end token, stop_token_ids or stop string before the reply has this many tokens (the
    # string's match waits at the edge, edge/text/stops.py). Bounded as max_tokens
    # is; the pipeline holds it to the max_tokens the request gets (vLLM's 400 too).
    min_tokens: Annotated[int, msgspec.Meta(ge=0, le=INT64_MAX)] | None = None
    # Tokens that end the reply ("stop"), left out of its text as vLLM leaves them; whether each is
    # one of this model's ids the pipeline checks.
    stop_token_ids: Annotated[list[int], msgspec.Meta(max_length=MAX_STOP_TOKEN_IDS)] | None = None
    # vLLM's: the stop string that ended the reply ends its text too (edge/text/stops.py), and so
    # does the text of a stop_token_ids token (the detokenizer leaves none out).
    include_stop_str_in_output_sent: bool | None = msgspec.field(
        default=None, name="include_stop_str_in_output"
    )
    # vLLM's (transformers' apply_chat_template arguments): how the prompt ends (`prompt_end`).
    add_generation_prompt_sent: bool | None = msgspec.field(default=None, name="add_generation_prompt")
    continue_final_message_sent: bool | None = msgspec.field(default=None, name="continue_final_message")
    # Any int64, as OpenAI takes it; the pipeline maps it onto the replicas' unsigned seed.
    seed: Int64 | None = None
    stop: str | Annotated[list[str], msgspec.Meta(max_length=MAX_STOP_SEQUENCES)] | None = None
    stream_options: StreamOptions | None = None
    user: Annotated[str, msgspec.Meta(max_length=256)] | None = None
    n: Annotated[int, msgspec.Meta(ge=1, le=128)] | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    logit_bias: Annotated[dict[int, Bias], msgspec.Meta(max_length=MAX_LOGIT_BIAS_ENTRIES)] | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, msgspec.Meta(ge=0, le=20)] | None = None
    conversation_id: ConversationId | None = None
    # OpenAI's processing tier: any this server is asked for, it serves as "default" (it has no
    # other) and says so, as OpenAI says the tier that served a request naming one
    # (`answered_service_tier`). Any string: a tier OpenAI adds later is served as default too.
    service_tier: Annotated[str, msgspec.Meta(max_length=64)] | None = None
    response_format: ResponseFormat | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: ToolChoice | None = None
    # The deprecated forms of tools and tool_choice.
    functions: list[dict[str, Any]] | None = None
    function_call: ToolChoice | None = None
    # vLLM's structured outputs (STRUCTURED_OUTPUTS), decoded only to be refused by name.
    guided_json: Refused = None
    guided_choice: Refused = None
    guided_regex: Refused = None
    guided_grammar: Refused = None
    guided_decoding_backend: Refused = None
    guided_whitespace_pattern: Refused = None
    structured_outputs: Refused = None
    # vLLM's JSON held between tags the reply opens (its `triggers`): a client reading the tagged
    # calls out of the reply found free prose instead.
    structural_tag: Refused = None
    # OpenAI's output modalities and search: a text model answers in text and searches nothing.
    modalities: list[str] | None = None
    audio: RefusedOutput = None
    web_search_options: RefusedOutput = None
    # OpenAI's moderated completions (the SDK's `moderation`): a client asking to block a flagged
    # prompt or reply took an unmoderated one, and found no `moderation` results in it.
    moderation: RefusedOutput = None
    # OpenAI's reasoning and length controls: this model does no reasoning and has no verbosity
    # setting, so only what it does anyway is taken ("none"; "medium", OpenAI's default).
    reasoning_effort: Annotated[str, msgspec.Meta(max_length=64)] | None = None
    verbosity: Annotated[str, msgspec.Meta(max_length=64)] | None = None
    # vLLM's sampling and prompt extensions neither replica applies (VLLM_UNAPPLIED), decoded
    # only to be refused when they ask for something.
    min_p: RefusedSampling = None
    allowed_token_ids: RefusedSampling = None
    bad_words: RefusedSampling = None
    prompt_logprobs: RefusedSampling = None
    best_of: RefusedSampling = None
    use_beam_search: RefusedSampling = None
    echo: RefusedSampling = None
    truncate_prompt_tokens: RefusedSampling = None
    chat_template: RefusedSampling = None
    # vLLM's detokenizing and tokenizing switches: the edge's detokenizer always drops special
    # tokens, and the chat template alone writes the prompt's.
    skip_special_tokens: RefusedSampling = None
    spaces_between_special_tokens: RefusedSampling = None
    add_special_tokens: RefusedSampling = None
    # vLLM's logits processors named by the client (a server started with --logits-processor-pattern
    # loads them; without one, vLLM answers 400): no replica here loads code a request names.
    logits_processors: RefusedSampling = None

    @property
    def ignore_eos(self) -> bool:
        return self.ignore_eos_sent is True

    @property
    def include_stop_str_in_output(self) -> bool:
        return self.include_stop_str_in_output_sent is True

    @property
    def add_generation_prompt(self) -> bool:
        """True unless sent false (vLLM's default)."""
        return self.add_generation_prompt_sent is not False

    @property
    def continue_final_message(self) -> bool:
        return self.continue_final_message_sent is True

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    @property
    def replica_seed(self) -> int | None:
        """The seed as every replica takes it: unsigned 64-bit. A negative int64 wraps (two's
        complement), so `-1` is a valid, reproducible seed rather than an engine error."""
        return None if self.seed is None else self.seed % 2**64

    @property
    def replica_top_p(self) -> float | None:
        """top_p as every replica takes it: above 0 (the engine and TensorRT-LLM refuse 0) and at
        least float32's smallest normal number, since a Triton replica reads it into an FP32 tensor
        where 1e-300 is 0. What a smaller top_p asks for is sent as greedy (`greedy_by_top_p`)."""
        return None if self.top_p is None else max(self.top_p, FLOAT32_MIN_NORMAL)

    @property
    def greedy_by_top_p(self) -> bool:
        """A top_p below what a replica takes (0, which OpenAI's clients send for the steadiest
        reply): a nucleus of no mass, the most likely token alone, which is greedy decoding, and a
        replica is asked for that (temperature 0; the seed then draws nothing). Sent as a nucleus
        of float32's smallest normal mass instead, a replica ranked the float32 weights, and where
        the two largest logits lay under a float32 step apart its exp() rounded them to one weight
        and the tie went to the lower token id, not the larger logit."""
        return self.top_p is not None and self.top_p < FLOAT32_MIN_NORMAL

    @property
    def stop_strings(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    @property
    def prompt_end(self) -> PromptEnd:
        """A new assistant turn for the reply (the default); the final message continued, an
        assistant's reply the client began (vLLM's prefill); or, without either, the conversation as
        it stands."""
        if self.continue_final_message:
            return "continue"
        return "reply" if self.add_generation_prompt else "as_is"

    @property
    def answered_service_tier(self) -> str | None:
        """The tier the answer and its chunks name: only where the request named one, as OpenAI
        answers; every request here is served at the one tier there is."""
        return None if self.service_tier is None else SERVED_TIER

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and bool(self.stream_options.include_usage)


_decoder = msgspec.json.Decoder(ChatCompletionRequest)
# vLLM's ways to hold a reply to a schema, a choice, a regex, a grammar or a schema between tags
# (structural_tag), and to tune that: neither replica path constrains decoding (the in-process engine
# has no grammar, and the Triton replicas are sent no guided-decoding input), so each is refused.
STRUCTURED_OUTPUTS = (
    "guided_json",
    "guided_choice",
    "guided_regex",
    "guided_grammar",
    "structural_tag",
    "structured_outputs",
    "guided_decoding_backend",
    "guided_whitespace_pattern",
)
# vLLM's extensions that change the reply or the prompt, which neither replica path applies (the
# in-process engine has none of them; the Triton replicas are sent no such input): each is refused by
# name when it asks for something, as the README promises ("refused by name, never ignored"), since a
# client sending min_p 0.9 or bad_words ["Paris"] would otherwise take the reply as shaped by them.
# Null, false, 0, an empty list (and best_of 1: one reply, as n=1) ask for nothing, as clients that
# fill every field send them.
VLLM_UNAPPLIED = {
    "min_p": "a min-p cut",
    "allowed_token_ids": "a reply held to given tokens",
    "bad_words": "banned words",
    "prompt_logprobs": "the prompt's log-probabilities",
    "best_of": "the best of several replies",
    "use_beam_search": "beam search",
    "echo": "the prompt echoed in the reply",
    "truncate_prompt_tokens": "a truncated prompt",
    "chat_template": "a chat template of the client's",
    "skip_special_tokens": "special tokens' text in the reply",
    "spaces_between_special_tokens": "special tokens' text in the reply",
    "add_special_tokens": "special tokens added to the templated prompt",
    "logits_processors": "logits processors of the client's naming",
}
# Of those, the ones vLLM has true by default: true asks for nothing, false for something.
_TRUE_BY_DEFAULT = frozenset({"skip_special_tokens", "spaces_between_special_tokens"})
_STRUCTURED = (
    "is one of vLLM's structured outputs: this server cannot hold a reply to a schema, choice, regex, "
    "grammar or structural tag. Ask for the form in the prompt and check the reply."
)
# Every parameter refused by name (unsupported_parameter) when sent with a value that asks for
# something, with what the error says of it.
REFUSED: dict[str, str] = {
    **dict.fromkeys(STRUCTURED_OUTPUTS, _STRUCTURED),
    "audio": "asks for an audio reply, which this model cannot give.",
    "web_search_options": "asks for a web search, which this model cannot give.",
    "moderation": "asks for a moderated completion, which this server does not run.",
    **{
        name: f"asks for {what}, which this server does not apply (one of vLLM's extensions)."
        for name, what in VLLM_UNAPPLIED.items()
    },
}


def _asks_for_something(name: str, value: Any) -> bool:
    """Any value but null asks, except for vLLM's extensions, where false, 0, an empty list or
    string (and best_of 1) ask for nothing too; for the two true by default, only true does."""
    if value is None or name not in VLLM_UNAPPLIED:
        return value is not None
    if name == "best_of":
        return bool(value != 1)
    if name in _TRUE_BY_DEFAULT:
        return value is not True
    return value is not False and value != 0 and value != [] and value != ""


# msgspec names the place as "at `$.a.b`", or "at `key` in `$.a`" for a dict key; "[...]" is any key.
_PATH = re.compile(r"`\$\.?(?P<path>[^`]*?)(?:\[\.\.\.\])?`")
_MISSING = re.compile(r"missing required field `(?P<field>[^`]+)`")


def _param_of(message: str) -> str | None:
    path = _PATH.search(message)
    missing = _MISSING.search(message)
    parts = [p for p in (path.group("path") if path else "", missing.group("field") if missing else "") if p]
    return ".".join(parts) if parts else None


# OpenAI's code for each of msgspec's ways to refuse a value, as the edge's own checks give them
# (_check_content): without one, a body missing `messages` was code null where a message missing its
# content was `missing_required_parameter`. The first that matches the message wins; a refusal of
# no known form stays null.
_CODES = (
    (re.compile(r"^Object missing required field"), "missing_required_parameter"),
    (re.compile(r"^Expected `[^`]*`, got `"), "invalid_type"),
    (re.compile(r"^Invalid enum value|^Expected `str` matching regex"), "invalid_value"),
    (re.compile(r"^Expected `int` >="), "integer_below_min_value"),
    (re.compile(r"^Expected `int` <="), "integer_above_max_value"),
    (re.compile(r"^Expected `float` >="), "decimal_below_min_value"),
    (re.compile(r"^Expected `float` <="), "decimal_above_max_value"),
    (re.compile(r"^Expected `array` of length >= 1 "), "empty_array"),
    (re.compile(r"^Expected `array` of length <="), "array_above_max_length"),
    (re.compile(r"^Expected `str` of length <="), "string_above_max_length"),
)


def _code_of(message: str) -> str | None:
    return next((code for pattern, code in _CODES if pattern.search(message)), None)


_UTF8_BOM = b"\xef\xbb\xbf"


def parse_chat_request(body: bytes) -> ChatCompletionRequest:
    try:
        req = _decoder.decode(body)
    except msgspec.ValidationError as exc:
        said = str(exc)
        raise invalid_request(
            f"Invalid request: {quoted_values_shown(said)}", _param_of(said), _code_of(said)
        ) from None
    except msgspec.DecodeError:
        if body.startswith(_UTF8_BOM) and not (rest := body[len(_UTF8_BOM) :]).startswith(_UTF8_BOM):
            # Some Windows tools write one before the JSON; Python's json.loads (vLLM, FastAPI)
            # skips one. Tried only once the plain decode failed: no cost on any other request.
            return parse_chat_request(rest)
        raise invalid_request("We could not parse the JSON body of your request.", None) from None
    except RecursionError:
        # msgspec stops at a fixed nesting depth (it does not overflow the C stack) and says so
        # with a RecursionError: a body nested that deep is the client's error, not ours.
        raise invalid_request(
            "We could not parse the JSON body of your request: it is nested too deeply.",
            None,
            code="json_too_deep",
        ) from None
    if req.stream_options is not None and not req.stream:
        # As OpenAI and vLLM answer it: the options say what a stream carries (usage in its own
        # chunk); a reply that is not streamed has its usage anyway.
        raise invalid_request(
            "The 'stream_options' parameter is only allowed when 'stream' is enabled.", "stream_options"
        )
    if req.stream_options is not None and req.stream_options.continuous_usage_stats:
        raise invalid_request(
            "Unsupported parameter: 'stream_options.continuous_usage_stats' asks for usage in every "
            "chunk, which this server does not send (one of vLLM's extensions): the usage comes in "
            "its own last chunk with include_usage.",
            "stream_options.continuous_usage_stats",
            code="unsupported_parameter",
        )
    if req.continue_final_message and req.add_generation_prompt:
        # vLLM's 400 (and transformers' error): a new turn opened after the message to continue.
        raise invalid_request(
            "Cannot set both 'continue_final_message' and 'add_generation_prompt' to true: send "
            "add_generation_prompt false to continue the final message.",
            "continue_final_message",
        )
    if req.n is not None and req.n != 1:
        raise invalid_request("Only n=1 is supported.", "n")
    if req.logprobs or req.top_logprobs:
        raise invalid_request(
            "logprobs are not supported: this server's replicas cannot return the model's own "
            "log-probabilities.",
            "logprobs" if req.logprobs else "top_logprobs",
            code="unsupported_parameter",
        )
    if req.response_format is not None and req.response_format.type != "text":
        raise invalid_request(
            f"Unsupported value: 'response_format' of type '{req.response_format.type}' is not supported: "
            "this server cannot hold a reply to JSON. Ask for JSON in the prompt and check the reply.",
            "response_format",
            code="unsupported_value",
        )
    for name, says in REFUSED.items():
        if _asks_for_something(name, getattr(req, name)):
            raise invalid_request(
                f"Unsupported parameter: '{name}' {says}", name, code="unsupported_parameter"
            )
    if req.reasoning_effort not in (None, "none"):
        raise invalid_request(
            f"Unsupported value: 'reasoning_effort' of {req.reasoning_effort!r} is not supported: this "
            "model does no reasoning. Supported values are: 'none'.",
            "reasoning_effort",
            code="unsupported_value",
        )
    if req.verbosity not in (None, "medium"):
        raise invalid_request(
            f"Unsupported value: 'verbosity' of {shown(req.verbosity)!r} is not supported: this model has no "
            "verbosity setting. Supported values are: 'medium'. Ask for the length in the prompt.",
            "verbosity",
            code="unsupported_value",
        )
    if req.modalities is not None and any(m != "text" for m in req.modalities):
        other = next(m for m in req.modalities if m != "text")
        raise invalid_request(
            f"Unsupported value: 'modalities' asks for {shown(other)!r}: this model replies in text only.",
            "modalities",
            code="unsupported_value",
        )
    for index, message in enumerate(req.messages):
        _check_content(message, index)
    for tools, choice, (tools_param, choice_param) in (
        (req.tools, req.tool_choice, ("tools", "tool_choice")),
        (req.functions, req.function_call, ("functions", "function_call")),
    ):
        if isinstance(choice, str) and choice not in _CHOICES[choice_param]:
            raise invalid_request(
                f"Invalid value: '{shown(choice)}'. Supported values are: {_CHOICES_TEXT[choice_param]}.",
                choice_param,
                code="invalid_value",
            )
        if _may_call_tools(tools, choice):
            param = tools_param if tools else choice_param
            raise invalid_request(
                f"Unsupported parameter: '{param}' asks for tool calls, which this model cannot make. "
                f"Send no {tools_param}, or {choice_param} 'none'.",
                param,
                code="unsupported_parameter",
            )
    return req


def _check_content(message: ChatMessage, index: int) -> None:
    """Only an assistant's message may come without content (as OpenAI's, whose content is then in
    the tool calls it made): a user's or system's message without any would be read as an empty
    turn, a prompt the client never meant (OpenAI refuses it; vLLM reads it as empty). A function
    message's content may be null (OpenAI's schema: a function that returned nothing), but it must
    name its function, as OpenAI requires: without it the model reads a result of nothing known."""
    content = message.content
    if message.role == "function" and message.name is None:
        raise invalid_request(
            f"Missing required parameter: 'messages[{index}].name'.",
            f"messages[{index}].name",
            code="missing_required_parameter",
        )
    if isinstance(content, list):
        _check_content_parts(content, index)
    elif isinstance(content, str) or message.role == "assistant":
        return
    elif content is None and message.role == "function":
        return
    elif content is msgspec.UNSET:
        raise invalid_request(
            f"Missing required parameter: 'messages[{index}].content'.",
            f"messages[{index}].content",
            code="missing_required_parameter",
        )
    else:
        raise invalid_request(
            f"Invalid type for 'messages[{index}].content': expected one of a string or array of "
            "objects, but got null instead.",
            f"messages[{index}].content",
            code="invalid_type",
        )


def _check_content_parts(parts: list[ContentPart], message: int) -> None:
    """A part this text model cannot read (an image, audio, a file) is refused by name: dropped, it
    would leave the model answering about something it never saw (vLLM refuses one too). No parts
    at all is an empty turn, refused as OpenAI refuses it."""
    if not parts:
        raise invalid_request(
            f"Invalid 'messages[{message}].content': empty array. Expected an array with minimum "
            "length 1, but got an empty array instead.",
            f"messages[{message}].content",
            code="empty_array",
        )
    for index, part in enumerate(parts):
        if part.type not in _READABLE_PARTS:
            raise invalid_request(
                f"Unsupported value: content part type '{shown(part.type)}' is not supported: this model "
                "reads text only.",
                f"messages[{message}].content[{index}].type",
                code="unsupported_value",
            )
        if part.words() is None:
            raise invalid_request(
                f"Invalid request: a '{part.type}' content part needs its '{part.type}'.",
                f"messages[{message}].content[{index}].{part.type}",
            )


# The choices each field takes as a string, as OpenAI answers any other: a misspelt one ("None") read
# as a call the model cannot make sent the client to fix what was never asked for.
_CHOICES = {"tool_choice": ("none", "auto", "required"), "function_call": ("none", "auto")}
_CHOICES_TEXT = {"tool_choice": "'none', 'auto', and 'required'", "function_call": "'none' and 'auto'"}


def _may_call_tools(tools: list[dict[str, Any]] | None, choice: ToolChoice | None) -> bool:
    """Whether the request lets the model call a tool (tools offered, not with "none") or makes it
    ("required" or a named function, with or without tools)."""
    if choice == "none":
        return False
    if choice is not None and choice != "auto":
        return True
    return bool(tools)


def unknown_model(name: str) -> ApiError:
    """OpenAI's words: a model the key's tier may not use answers as one that does not exist
    (edge/models/catalog.py), and the message says it may be either. The name is the caller's (the
    body's `model`, a path's id), of any length the body or request line allows: cut at 64
    characters as every echo of user input is (a real name is far shorter)."""
    return ApiError(
        404,
        f"The model `{name[:64]}` does not exist or you do not have access to it.",
        param="model",
        code="model_not_found",
    )


def unknown_tier(tier: str) -> ApiError:
    """A key whose tier the settings do not name (renamed or removed, its keys left): the same answer
    on every route that needs the tier, so a client learns its key is to fix, not that nothing is served."""
    return ApiError(403, f"Your key's tier {tier!r} is not configured.", code="unknown_tier")
