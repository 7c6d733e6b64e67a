"""The CPU model repository: our engine as a decoupled Python-backend model (model.py runs inside Triton)."""
