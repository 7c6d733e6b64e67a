"""The key tests' store fixtures (SQLite and dynalite) serve the usage tests too."""

from tests.keys.conftest import backend, dynalite_endpoint, key_store, usage_store  # noqa: F401
