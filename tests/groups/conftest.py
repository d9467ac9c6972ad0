"""Fixtures: the runtime suite's real supervisor (`make_store`, `store`)."""

from tests.runtime.conftest import make_store, store

__all__ = ["make_store", "store"]
