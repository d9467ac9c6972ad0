"""Fixtures: the runtime suite's real supervisor (`make_store`, `store`), for the commands
that also run against a live store."""

from tests.runtime.conftest import make_store, store

__all__ = ["make_store", "store"]
