"""The key tests' store fixtures (SQLite and dynalite) serve the usage tests too."""

from tests.keys.conftest import backend, key_store, usage_store  # noqa: F401
from tests.messages.conftest import dynalite_endpoint  # noqa: F401
