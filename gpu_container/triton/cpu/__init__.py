"""Our engine as a decoupled Triton Python-backend model, behind the `tensorrt_llm` contract.

model.py and config.pbtxt are what Triton reads (the Python backend loads a file named model.py from
the model's version folder; repository.py renders both into a repository); model.py only hands over
to engine_model.py (EngineModel), which decodes requests with tensors.py and sends responses from
outbox.py's queue on its own thread.
"""
