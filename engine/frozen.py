"""Frozen dataclasses without the `dataclasses` module at import: `dataclass(frozen=True)`.

Every producer process imports three public frozen dataclasses (`StoreSettings`,
`Message`, `Geometry`). Decorating them with `dataclasses.dataclass` compiles their
`__init__`, `__repr__`, `__eq__`, `__hash__`, `__setattr__` and `__delattr__` with `exec`
at each import, and importing `dataclasses` loads `inspect` (and `ast`, `dis`,
`tokenize`): together ~75M instructions of a producer's ~230M start
(bench/results/client_start.md). `dataclass` here makes a class that behaves as the
`dataclasses` one would, with shared methods and no code compiled:

- `__init__` (unless the class writes one), `__repr__`, `__eq__`, `__hash__`,
  `__match_args__`, frozen `__setattr__`/`__delattr__` (raising
  `dataclasses.FrozenInstanceError`), and with `slots=True` the `__slots__` and the
  pickling state (`__getstate__`/`__setstate__`) of `dataclass(frozen=True, slots=True)`;
- `__dataclass_fields__` and `__dataclass_params__`, built on first look by decorating a
  twin with the real `dataclasses.dataclass` (which is imported then): so
  `dataclasses.fields`, `replace`, `asdict`, `astuple` and `is_dataclass` work on the
  class and its instances as on the dataclass;
- `__signature__` on the class, the twin's (`inspect.signature(cls)`), also on first look.

Only what mqstore's classes use: `frozen=True`, `slots`, fields with a default or a
`field(default_factory=...)`, no `ClassVar`/`InitVar`, no `__post_init__`, no inheritance
between such classes. Modules write `if TYPE_CHECKING: from dataclasses import dataclass,
field`, so the type checker sees the real dataclass. `tests/engine/test_frozen.py` checks
each class against its twin made by `dataclasses`.
"""

from __future__ import annotations

import threading
from operator import attrgetter
from typing import Any, Final

_MISSING: Final = object()


class _Factory:
    """A field's `default_factory` (`field(default_factory=...)`); shown as dataclasses
    shows it in a signature."""

    __slots__ = ("make",)

    def __init__(self, make: Any) -> None:
        self.make = make

    def __repr__(self) -> str:
        return "<factory>"


def field(*, default_factory: Any) -> Any:
    """`dataclasses.field(default_factory=...)`, the one form mqstore's classes use."""
    return _Factory(default_factory)


class _Twin:
    """A class attribute made on first look from the class's twin decorated by the real
    `dataclasses.dataclass` (`__dataclass_fields__`, `__dataclass_params__`,
    `__signature__`); then set on the class in its place."""

    def __init__(self, attr: str) -> None:
        self.attr = attr

    def __get__(self, obj: object, owner: type) -> Any:
        twin = _twin(owner)
        if self.attr == "__signature__":
            import inspect

            value: Any = inspect.signature(twin)
        else:
            value = getattr(twin, self.attr)
        type.__setattr__(owner, self.attr, value)
        return value


def _twin(cls: type) -> type:
    import dataclasses

    spec: dict[str, Any] = cls.__dict__["_dc_spec"]
    ns: dict[str, Any] = {"__annotations__": dict(spec["annotations"])}
    ns["__module__"] = cls.__module__
    ns["__qualname__"] = cls.__qualname__
    for name, default in spec["defaults"].items():
        if isinstance(default, _Factory):
            ns[name] = dataclasses.field(default_factory=default.make)
        else:
            ns[name] = default
    twin = type(cls.__name__, (), ns)
    return dataclasses.dataclass(frozen=True, slots=spec["slots"])(twin)


_repr_running: set[tuple[int, int]] = set()


def _repr(self: Any) -> str:
    # dataclasses' `_recursive_repr`: "..." for an instance already being shown
    key = (id(self), threading.get_ident())
    if key in _repr_running:
        return "..."
    _repr_running.add(key)
    try:
        names = type(self)._dc_names
        values = type(self)._dc_get(self)
        inner = ", ".join([f"{n}={v!r}" for n, v in zip(names, values, strict=True)])
        return f"{self.__class__.__qualname__}({inner})"
    finally:
        _repr_running.discard(key)


def _eq(self: Any, other: Any) -> Any:
    if other.__class__ is self.__class__:
        get = self._dc_get
        return get(self) == get(other)
    return NotImplemented


def _hash(self: Any) -> int:
    return hash(type(self)._dc_get(self))


def _frozen_error(message: str) -> Exception:
    from dataclasses import FrozenInstanceError  # the error path only

    return FrozenInstanceError(message)


def _make_setattr(cls: type, names: frozenset[str]) -> Any:
    def __setattr__(self: Any, name: str, value: Any) -> None:
        if type(self) is cls or name in names:
            raise _frozen_error(f"cannot assign to field {name!r}")
        super(cls, self).__setattr__(name, value)  # type: ignore[arg-type]  # (mypy's narrowing)

    def __delattr__(self: Any, name: str) -> None:
        if type(self) is cls or name in names:
            raise _frozen_error(f"cannot delete field {name!r}")
        super(cls, self).__delattr__(name)  # type: ignore[arg-type]  # (mypy's narrowing)

    return __setattr__, __delattr__


def _make_init(qualname: str, names: tuple[str, ...], defaults: dict[str, Any]) -> Any:
    required = [n for n in names if n not in defaults]
    known = frozenset(names)
    set_field = object.__setattr__
    if len(required) < len(names):
        takes = f"from {len(required) + 1} to {len(names) + 1} positional arguments"
    else:
        takes = f"{len(names) + 1} positional arguments"

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        if len(args) > len(names):
            raise TypeError(f"{qualname}.__init__() takes {takes} but {len(args) + 1} were given")
        given = dict(zip(names, args, strict=False))  # args may be fewer
        for k, v in kwargs.items():
            if k not in known:
                raise TypeError(f"{qualname}.__init__() got an unexpected keyword argument {k!r}")
            if k in given:
                raise TypeError(f"{qualname}.__init__() got multiple values for argument {k!r}")
            given[k] = v
        missing = [n for n in required if n not in given]
        if missing:
            raise TypeError(f"{qualname}.__init__() {_missing_text(missing)}")
        for n in names:
            v = given.get(n, _MISSING)
            if v is _MISSING:
                v = defaults[n]
                if isinstance(v, _Factory):
                    v = v.make()
            set_field(self, n, v)

    return __init__


def _missing_text(missing: list[str]) -> str:
    # as Python words a call that misses positional-or-keyword arguments
    quoted = [repr(n) for n in missing]
    if len(quoted) == 1:
        listed = quoted[0]
    elif len(quoted) == 2:
        listed = f"{quoted[0]} and {quoted[1]}"
    else:
        listed = ", ".join(quoted[:-1]) + f", and {quoted[-1]}"
    s = "" if len(missing) == 1 else "s"
    return f"missing {len(missing)} required positional argument{s}: {listed}"


def _getstate(self: Any) -> list[Any]:
    return list(type(self)._dc_get(self))


def _setstate(self: Any, state: list[Any]) -> None:
    for name, value in zip(type(self)._dc_names, state, strict=False):
        object.__setattr__(self, name, value)


def dataclass(*, frozen: bool, slots: bool = False) -> Any:
    """`dataclasses.dataclass(frozen=True[, slots=True])` for a class with fields only
    (see the module's docstring for what is covered)."""
    if not frozen:
        raise TypeError("engine.frozen.dataclass makes frozen classes only")

    def wrap(cls: type) -> type:
        return _make(cls, slots)

    return wrap


def _make(cls: type, slots: bool) -> type:
    ns = dict(cls.__dict__)
    annotations: dict[str, Any] = ns.get("__annotations__", {})
    names = tuple(annotations)
    if len(names) < 2:
        raise TypeError("engine.frozen.dataclass: a class of two fields or more")
    defaults = {n: ns[n] for n in names if n in ns}
    seen_default = False
    for n in names:  # as dataclasses refuses
        if n in defaults:
            seen_default = True
        elif seen_default:
            raise TypeError(f"non-default argument {n!r} follows default argument")
    ns.pop("__dict__", None)
    ns.pop("__weakref__", None)
    for n, d in defaults.items():
        if slots or isinstance(d, _Factory):
            del ns[n]  # dataclasses keeps a plain default as a class attribute without slots
    if slots:
        ns["__slots__"] = names
        ns["__getstate__"] = _getstate
        ns["__setstate__"] = _setstate
    ns["_dc_spec"] = {"annotations": annotations, "defaults": defaults, "slots": slots}
    ns["_dc_names"] = names
    ns["_dc_get"] = staticmethod(attrgetter(*names)) if len(names) > 1 else None
    ns["__match_args__"] = names
    if "__init__" not in ns:
        ns["__init__"] = _make_init(cls.__qualname__, names, defaults)
    ns["__repr__"] = _repr
    ns["__eq__"] = _eq
    ns["__hash__"] = _hash
    for attr in ("__dataclass_fields__", "__dataclass_params__", "__signature__"):
        ns[attr] = _Twin(attr)
    new = type(cls)(cls.__name__, cls.__bases__, ns)
    new.__qualname__ = cls.__qualname__
    setattr_, delattr_ = _make_setattr(new, frozenset(names))
    type.__setattr__(new, "__setattr__", setattr_)
    type.__setattr__(new, "__delattr__", delattr_)
    return new
