"""`engine.frozen.dataclass` against `dataclasses.dataclass`: each class it makes
(`StoreSettings`, `Message`, `Geometry`) behaves as the same source decorated by the real
`dataclasses` does. The oracle is that twin: the class's own source, executed in its
module's namespace with `dataclasses.dataclass` and `dataclasses.field`."""

from __future__ import annotations

import ast
import copy
import dataclasses
import inspect
import pickle
import textwrap
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqstore.conf.settings import FlushDiskType, StoreSettings
from mqstore.engine import frozen
from mqstore.engine.geometry import Geometry
from mqstore.engine.record import Message

CLASSES = (StoreSettings, Message, Geometry)


def twin_of(cls: type) -> type:
    """`cls`'s source decorated by the real dataclasses, in a copy of its module's globals
    (a `field(default_factory=...)` there made by `dataclasses.field`), without an
    `__init__` the class writes out: the twin's is the one `dataclasses` makes."""
    module = inspect.getmodule(cls)
    assert module is not None
    ns = dict(vars(module))
    ns["dataclass"] = dataclasses.dataclass
    ns["field"] = dataclasses.field
    for k, v in ns.items():
        if isinstance(v, frozen._Factory):
            ns[k] = dataclasses.field(default_factory=v.make)
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0]
    assert isinstance(body, ast.ClassDef)
    body.body = [
        n for n in body.body if not (isinstance(n, ast.FunctionDef) and n.name == "__init__")
    ]
    exec(compile(tree, module.__file__ or "?", "exec"), ns)
    twin = ns[cls.__name__]
    assert isinstance(twin, type) and "__dataclass_params__" in vars(twin)
    return twin


TWINS = {cls: twin_of(cls) for cls in CLASSES}


def args_for(cls: type) -> dict[str, Any]:
    """Values for the fields without a default."""
    return {StoreSettings: {}, Message: {"topic": "t", "body": b"b"},
            Geometry: {"segment_size_bytes": 1 << 20, "cq_file_size_bytes": 6000,
                       "hash_slot_num": 50, "index_num": 200}}[cls]  # fmt: skip


def result(call: Any) -> tuple[str, Any]:
    """What a call gives: ("ok", value) or (exception type name, message)."""
    try:
        return "ok", call()
    except Exception as e:  # the exception is the result compared
        return type(e).__name__, str(e)


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_the_class_is_the_dataclass_its_twin_is(cls: type) -> None:
    twin = TWINS[cls]
    assert cls is not twin and not isinstance(cls, frozen._Twin)
    assert dataclasses.is_dataclass(cls)
    assert repr(cls.__dataclass_params__) == repr(twin.__dataclass_params__)  # type: ignore[attr-defined]
    mine, theirs = dataclasses.fields(cls), dataclasses.fields(twin)
    assert [repr(f) for f in mine] == [repr(f) for f in theirs]
    assert str(inspect.signature(cls)) == str(inspect.signature(twin))
    assert cls.__match_args__ == twin.__match_args__  # type: ignore[attr-defined]
    assert getattr(cls, "__slots__", None) == getattr(twin, "__slots__", None)
    assert cls.__qualname__ == twin.__qualname__ and cls.__doc__ == twin.__doc__
    assert type(cls) is type(twin) is type
    for f in theirs:  # a plain default stays a class attribute without slots
        assert hasattr(cls, f.name) == hasattr(twin, f.name)
        if not cls.__dict__.get("__slots__") and hasattr(twin, f.name):
            assert getattr(cls, f.name) == getattr(twin, f.name)
    assert {m for m in vars(twin) if not m.startswith("__")} <= set(vars(cls))


def pair(cls: type, changes: dict[str, Any]) -> tuple[Any, Any]:
    kw = {**args_for(cls), **changes}
    return cls(**kw), TWINS[cls](**kw)


MESSAGES = st.fixed_dictionaries(
    {"topic": st.text(max_size=8), "body": st.binary(max_size=8)},
    optional={
        "properties": st.dictionaries(st.text(max_size=4), st.text(max_size=4), max_size=3),
        "queue_id": st.integers(-5, 5),
        "born_host": st.text(max_size=6),
        "delay_level": st.integers(0, 3),
    },
)
SETTINGS = st.fixed_dictionaries(
    {},
    optional={
        "flush_disk_type": st.sampled_from(FlushDiskType),
        "segment_size_bytes": st.integers(1, 1 << 30),
        "delete_when": st.lists(st.integers(0, 23), max_size=3).map(tuple),
        "disk_space_warning_level_ratio": st.floats(0, 1),
        "compress_type": st.sampled_from(["NONE", "ZLIB"]),
    },
)
GEOMETRIES = st.fixed_dictionaries(
    {"segment_size_bytes": st.integers(0, 1 << 30), "index_num": st.integers(0, 99)}
)


def check_behaves_as_twin(cls: type, changes: dict[str, Any], other: dict[str, Any]) -> None:
    a, ta = pair(cls, changes)
    b, tb = pair(cls, other)
    assert repr(a) == repr(ta)
    assert (a == b) == (ta == tb) and (a != b) == (ta != tb)
    assert a == copy.copy(a) and a == copy.deepcopy(a)
    assert (a == ta) is False and (ta == a) is False  # another class: NotImplemented both ways
    assert result(lambda: hash(a)) == result(lambda: hash(ta))
    assert dataclasses.asdict(a) == dataclasses.asdict(ta)
    assert dataclasses.astuple(a) == dataclasses.astuple(ta)
    assert dataclasses.is_dataclass(a) and dataclasses.is_dataclass(cls)
    r = dataclasses.replace(a, **other)
    assert type(r) is cls and repr(r) == repr(dataclasses.replace(ta, **other))
    back = pickle.loads(pickle.dumps(a))
    assert type(back) is cls and back == a and repr(back) == repr(a)
    assert hasattr(a, "__dict__") == hasattr(ta, "__dict__")
    for name in (*(f.name for f in dataclasses.fields(ta)), "not_a_field"):
        mine = (result(lambda n=name: setattr(a, n, 1)), result(lambda n=name: delattr(a, n)))
        theirs = (result(lambda n=name: setattr(ta, n, 1)), result(lambda n=name: delattr(ta, n)))
        if name == "not_a_field" and "__slots__" in vars(cls):
            # Python 3.11's slots dataclass: its __setattr__ holds the class from before
            # the slots copy, so another name reaches super() with the wrong class and a
            # TypeError; here it is refused as any name of a frozen class's own instance
            assert [r[0] for r in theirs] == ["TypeError", "TypeError"]
            assert mine == (
                ("FrozenInstanceError", "cannot assign to field 'not_a_field'"),
                ("FrozenInstanceError", "cannot delete field 'not_a_field'"),
            )
        else:
            assert mine == theirs
    assert repr(a) == repr(ta)  # nothing changed by the refused assignments


@settings(max_examples=60, deadline=None)
@given(MESSAGES, MESSAGES)
def test_a_message_behaves_as_its_twin(changes: dict[str, Any], other: dict[str, Any]) -> None:
    check_behaves_as_twin(Message, changes, other)


@settings(max_examples=30, deadline=None)
@given(SETTINGS, SETTINGS)
def test_settings_behave_as_their_twin(changes: dict[str, Any], other: dict[str, Any]) -> None:
    check_behaves_as_twin(StoreSettings, changes, other)


@settings(max_examples=30, deadline=None)
@given(GEOMETRIES, GEOMETRIES)
def test_a_geometry_behaves_as_its_twin(changes: dict[str, Any], other: dict[str, Any]) -> None:
    check_behaves_as_twin(Geometry, changes, other)


CALLS: list[tuple[type, tuple[Any, ...], dict[str, Any]]] = [
    (Message, ("t", b"b"), {"properties": None}),
    (Message, ("t", b"b", {"k": "v"}, 1), {"delay_level": 2, "born_host": "h:1"}),
    (Message, (), {}),
    (Message, ("t",), {}),
    (Message, (), {"body": b""}),
    (Message, ("t", b"b"), {"topic": "u"}),
    (Message, ("t", b"b"), {"nope": 1}),
    (Message, ("t", b"b", {}, 1, 2, 3, 4, "h", "s", 5, 6, 7), {}),
    (Message, ("t", b"b", {}, 1, 2, 3, 4, "h", "s", 5, 6, 7, 8), {}),
    (Geometry, (1, 2, 3), {}),
    (Geometry, (1, 2, 3, 4, 5), {}),
    (Geometry, (), {"index_num": 1}),
    (StoreSettings, (FlushDiskType.SYNC_FLUSH, 1), {}),
    (StoreSettings, (), {"segment_size_bytes": 1, "flusher_rt_priority": 1}),
    (StoreSettings, (), {"segmentSize": 1}),
    (StoreSettings, tuple(range(80)), {}),
]


@pytest.mark.parametrize(("cls", "args", "kwargs"), CALLS)
def test_a_call_gives_what_the_twins_does(
    cls: type, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    """The same value, or the same TypeError with the same words."""
    mine = result(lambda: cls(*args, **kwargs))
    theirs = result(lambda: TWINS[cls](*args, **kwargs))
    if mine[0] == "ok":
        assert theirs[0] == "ok" and repr(mine[1]) == repr(theirs[1])
    else:
        assert mine == theirs


def test_a_default_factory_makes_each_instance_its_own() -> None:
    a, b = Message("t", b""), Message("t", b"")
    assert a.properties == {} and a.properties is not b.properties


def test_a_recursive_repr_shows_dots_as_dataclasses_does() -> None:
    m = Message("t", b"", properties={})
    m.properties["self"] = m  # type: ignore[index]
    t = TWINS[Message]("t", b"", properties={})
    t.properties["self"] = t
    assert repr(m) == repr(t)


def test_only_frozen_classes_of_two_fields_or_more() -> None:
    with pytest.raises(TypeError, match="frozen classes only"):
        frozen.dataclass(frozen=False)
    with pytest.raises(TypeError, match="two fields or more"):

        @frozen.dataclass(frozen=True)
        class One:
            a: int

    with pytest.raises(TypeError, match="non-default argument 'b' follows default argument"):

        @frozen.dataclass(frozen=True)
        class Two:
            a: int = 0
            b: int
