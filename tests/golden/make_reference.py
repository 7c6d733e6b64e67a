"""Print reference.py's data as JSON: greedy ids and tokenizer ids from Hugging Face transformers
loading the GGUF directly. Run once by hand in a throwaway venv (see reference.py), never in CI:
torch and transformers are not dependencies of this project.

    /tmp/refvenv/bin/python tests/golden/make_reference.py PATH/SmolLM2-135M-Instruct.Q4_1.gguf
"""

import importlib.metadata
import json
import sys

import tokenizers
import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "user", "content": "Write a haiku about the sea."}],
    [
        {"role": "system", "content": "You answer in one short sentence."},
        {"role": "user", "content": "How many legs does a spider have?"},
    ],
]
STRINGS = [
    "Hello world",
    "1234567890 and 3.14159",
    "  leading spaces\tand\ttabs\n\nnewlines",
    "naïve café, Straße, 東京, Ελληνικά",
    "emoji: 🌊🚀👍🏽 done",
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|><repo_name>x",
    "don't you'll we've I'm",
    "x=f(y)+2*z; // comment",
]


def main(path: str) -> None:
    directory, name = path.rsplit("/", 1)
    torch.set_num_threads(2)
    tok = AutoTokenizer.from_pretrained(directory, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(directory, gguf_file=name, dtype=torch.float32).eval()
    out: dict[str, object] = {
        "versions": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "gguf": importlib.metadata.version("gguf"),
            "tokenizers": tokenizers.__version__,
        },
        "conversations": [],
        "tokenizer": [],
    }
    for conv in CONVERSATIONS:
        text = tok.apply_chat_template(conv, tokenize=False, add_generation_prompt=True)
        ids = tok(text, add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            gen = model.generate(
                torch.tensor([ids]), max_new_tokens=20, do_sample=False, eos_token_id=2, pad_token_id=2
            )
        new = gen[0, len(ids) :].tolist()
        out["conversations"].append(  # type: ignore[attr-defined]
            {
                "messages": conv,
                "prompt_text": text,
                "prompt_ids": ids,
                "greedy_ids": new,
                "greedy_text": tok.decode(new),
            }
        )
    for s in STRINGS:
        out["tokenizer"].append({"text": s, "ids": tok(s, add_special_tokens=False)["input_ids"]})  # type: ignore[attr-defined]
    json.dump(out, sys.stdout, indent=1, ensure_ascii=False)


if __name__ == "__main__":
    main(sys.argv[1])
