"""Triton's entry point for the CPU engine model (the Python backend loads a file named model.py);
the model itself is gpu_container.triton.cpu.engine_model.

The backend stub embeds its own interpreter and ignores PYTHONPATH, so the import path of the
process that rendered this repository travels in the `python_path` parameter.
"""

import json
import os
import sys


class TritonPythonModel:
    def initialize(self, args):
        parameters = json.loads(args["model_config"]).get("parameters", {})
        python_path = parameters.get("python_path", {}).get("string_value", "")
        for entry in reversed([p for p in python_path.split(os.pathsep) if p]):
            if entry not in sys.path:
                sys.path.insert(0, entry)
        from gpu_container.triton.cpu.engine_model import EngineModel

        self._model = EngineModel(args)

    def execute(self, requests):
        return self._model.execute(requests)

    def finalize(self):
        self._model.finalize()
