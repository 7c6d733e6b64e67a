"""Text on the edge: chat template, tokenizer, incremental detokenizer, stop strings."""
