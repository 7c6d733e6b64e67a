"""Fixtures of the fault tests shared with other areas."""

from tests.support.admitted import admitter  # noqa: F401  (requests admitted on a real Redis)
