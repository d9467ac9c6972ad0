"""Fixtures: the runtime suite's real supervisor (`make_store`, `store`) and a directory
other users can traverse (`shared_dir`)."""

from tests.runtime.conftest import make_store, shared_dir, store

__all__ = ["make_store", "shared_dir", "store"]
