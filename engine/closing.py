"""`with obj:` for objects that hold files until `close()`: one definition of the pair."""

from __future__ import annotations

from typing import Self


class Closing:
    """`__enter__` returns the object and `__exit__` calls its `close()`, which the
    subclass defines (idempotent: a closed object may be closed again)."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
