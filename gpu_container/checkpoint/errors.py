"""What goes wrong with a checkpoint, said so that a person can fix it: every message names the file."""

from __future__ import annotations


class CheckpointError(ValueError):
    """A checkpoint directory or GGUF file that cannot be used (missing, truncated, malformed)."""


class UnsupportedModel(CheckpointError):
    """A well-formed file describing something the engine does not implement (an architecture, a
    quantization type, RoPE scaling): refused up front rather than loaded into wrong answers."""
