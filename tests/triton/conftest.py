"""The session's one real tritonserver (tests/support/triton_server.py), shared with the edge's
end-to-end tests; tests here reach it through TritonUpstream."""

from tests.support.triton_server import LocalTriton, local_triton

__all__ = ["LocalTriton", "local_triton"]
