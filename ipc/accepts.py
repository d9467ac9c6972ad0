"""What the client accepts: the validate step of `StoreClient.put` / `put_batch`, apart
from encoding and reserving, and the argument types of every public client method.

Two kinds of refusal, never mixed:

* **a wrong Python type** (`keys=123`, `body="text"`, `queue_id="1"`, a property value
  that is not a str) raises TypeError at the door, naming the method and the parameter
  (`put() argument 'keys' must be str or a sequence of str, not int`; in a batch
  `put_batch() messages[1]['keys']` or `messages[1].born_host`);
* **content that cannot be stored** (a bad topic name, a queue id outside the topic's
  queues, a host that does not parse, a number too wide for its field) is a status:
  the functions named `*_problem` return the reason, which the client returns as
  MESSAGE_ILLEGAL.

The client calls them before it reserves anything, so a refused put writes nothing; a
native put path calls or mirrors them rule for rule. Names are checked by
`engine.names`, properties' content by `engine.record.properties_problem`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Final, NoReturn

from mqstore.engine import record
from mqstore.engine.names import topic_problem
from mqstore.engine.record import Message
from mqstore.engine.recordcodes import format_host

Host = tuple[bytes, int, bool]  # engine.recordcodes.parse_host: address bytes, port, is IPv6
_BORN_V6: Final = int(record.SysFlag.BORNHOST_V6)
_STORE_V6: Final = int(record.SysFlag.STOREHOST_V6)


# A field of `engine.record.Message` left at its default is "unset": the client fills it
# in (born time: now; store host: the store's). Any other value is written as given or
# the put is refused.
UNSET_STORE_HOST: Final = Message(topic="", body=b"").store_host
_I32: Final = (-(2**31), 2**31 - 1)
_I64: Final = (-(2**63), 2**63 - 1)
_INT_FIELDS: Final = (
    ("flag", _I32),
    ("sys_flag", _I32),
    ("born_timestamp", _I64),
    ("reconsume_times", _I32),
    ("prepared_transaction_offset", _I64),
)


def int_fields_problem(m: Message) -> str | None:
    """Why one of `m`'s integer fields does not fit its width in the record."""
    for name, (lo, hi) in _INT_FIELDS:
        v = getattr(m, name)
        if not lo <= v <= hi:
            return f"{name} {v} does not fit the record's {'int' if hi < 2**32 else 'long'}"
    return None


def hosts_problem(
    sys_flag: int, born: Host, store: Host, store_host: str, given_store: Host | None
) -> str | None:
    """Why a message's hosts cannot be written as given. `born`: the parsed born host;
    `store`: the store's own (parsed from `store_host`); `given_store`: the message's
    store host when it set one. A store host other than the store's is refused (the
    store writes its own, as RocketMQ's broker sets storeHost itself; message ids are
    made from it). sysflag bits 0x10 / 0x20 say which host is IPv6: a caller may leave
    them 0 (they are set from the hosts) or set them to agree with the hosts."""
    if given_store is not None and given_store[:2] != store[:2]:
        shown = format_host(given_store[0], given_store[1])
        return f"store_host {shown} is not this store's ({store_host}): the store writes its own"
    want = (_BORN_V6 if born[2] else 0) | (_STORE_V6 if store[2] else 0)
    bits = sys_flag & (_BORN_V6 | _STORE_V6)
    if bits and bits != want:
        return (
            f"sys_flag host bits 0x{bits:02x} disagree with the hosts (born host IPv6: "
            f"{born[2]}, store host IPv6: {store[2]}); leave them 0 or set 0x{want:02x}"
        )
    return None


# --- argument types (TypeError) -------------------------------------------------------

Types = tuple[type, ...]
STR: Final[Types] = (str,)
OPT_STR: Final[Types] = (str, type(None))
INT: Final[Types] = (int,)
OPT_INT: Final[Types] = (int, type(None))
NUMBER: Final[Types] = (int, float)
BOOL: Final[Types] = (bool,)
PATH: Final[Types] = (str, os.PathLike)
_BODY: Final[Types] = (bytes, bytearray, memoryview)
_NAMES: Final = {
    str: "str", type(None): "None", int: "int", float: "float", bool: "bool",
    os.PathLike: "os.PathLike", bytes: "bytes", bytearray: "bytearray",
    memoryview: "memoryview",
}  # fmt: skip


def _wrong(label: str, what: str, value: object) -> NoReturn:
    raise TypeError(f"{label} must be {what}, not {type(value).__name__}")


def _is(value: object, types: Types) -> bool:
    """isinstance, except that a bool is not taken for an int (`queue_id=True`)."""
    return isinstance(value, types) and (type(value) is not bool or bool in types)


def check_types(method: str, **args: tuple[object, Types]) -> None:
    """Raise TypeError for the first `name=(value, types)` whose value is not one of
    `types`: "`method`() argument 'name' must be str or None, not int"."""
    for name, (value, types) in args.items():
        if not _is(value, types):
            _wrong(f"{method}() argument {name!r}", " or ".join(_NAMES[t] for t in types), value)


def _check_properties(label: str, properties: object) -> None:
    if not isinstance(properties, Mapping):
        _wrong(label, "a mapping of str to str, or None", properties)
    for k, v in properties.items():
        if type(k) is not str and not isinstance(k, str):
            _wrong(f"{label} key {k!r}", "str", k)
        if type(v) is not str and not isinstance(v, str):
            _wrong(f"{label}[{k!r}]", "str", v)


def check_put_types(
    label: str,
    topic: object,
    body: object,
    tags: object,
    keys: object,
    properties: object,
    queue_id: object,
    delay_level: object = None,
) -> None:
    """TypeError for a put's fields of the wrong type (None is right for all but the
    topic and the body). `label` formats a field's name into the message: "put()
    argument {!r}", "put_batch() messages[3][{!r}]". Cost: a few type checks, O(len) for
    a list of keys or a properties mapping."""
    if type(topic) is not str and not isinstance(topic, str):
        _wrong(label.format("topic"), "str", topic)
    if type(body) is not bytes and not isinstance(body, _BODY):
        _wrong(label.format("body"), "bytes, bytearray or memoryview", body)
    if tags is not None and not isinstance(tags, str):
        _wrong(label.format("tags"), "str or None", tags)
    if keys is not None and not isinstance(keys, str):
        if not isinstance(keys, Sequence) or isinstance(keys, _BODY):
            _wrong(label.format("keys"), "str or a sequence of str, or None", keys)
        for i, k in enumerate(keys):
            if not isinstance(k, str):
                _wrong(f"{label.format('keys')}[{i}]", "str", k)
    if properties is not None:
        _check_properties(label.format("properties"), properties)
    if queue_id is not None and not _is(queue_id, INT):
        _wrong(label.format("queue_id"), "int or None", queue_id)
    if delay_level is not None and not _is(delay_level, INT):
        _wrong(label.format("delay_level"), "int", delay_level)


_MESSAGE_STR_FIELDS: Final = ("born_host", "store_host")


def check_message_types(label: str, m: Message) -> None:
    """TypeError for a field of an `engine.record.Message` of the wrong type (the
    dataclass does not check). `label`: "put_batch() messages[3].{}"."""
    check_put_types(label, m.topic, m.body, None, None, m.properties, m.queue_id, m.delay_level)
    for name, _range in _INT_FIELDS:
        v = getattr(m, name)
        if not _is(v, INT):
            _wrong(label.format(name), "int", v)
    for name in _MESSAGE_STR_FIELDS:
        v = getattr(m, name)
        if not isinstance(v, str):
            _wrong(label.format(name), "str", v)


def check_batch_item(i: int, m: object) -> None:
    """TypeError unless messages[i] of a batch is a Message or a mapping whose fields
    have `put`'s types (missing or unknown fields are content: MESSAGE_ILLEGAL)."""
    if isinstance(m, Message):
        check_message_types(f"put_batch() messages[{i}].{{}}", m)
    elif isinstance(m, Mapping):
        check_put_types(
            f"put_batch() messages[{i}][{{!r}}]", m.get("topic", ""), m.get("body", b""),
            m.get("tags"), m.get("keys"), m.get("properties"), m.get("queue_id"),
            m.get("delay_level"),
        )  # fmt: skip
    else:
        _wrong(f"put_batch() messages[{i}]", "a dict of put's arguments or a Message", m)


def check_batch(messages: object) -> list[object]:
    """The batch as a list, or TypeError when `messages` is not an iterable."""
    if not isinstance(messages, Iterable) or isinstance(messages, str | bytes | Mapping):
        _wrong("put_batch() argument 'messages'", "an iterable of dicts or Messages", messages)
    return list(messages)


def check_send_back(message: object, group: object, delay_level: object, max_times: object) -> None:
    """TypeError for `send_back`'s arguments of the wrong type; ValueError for a group
    name that cannot be a topic's suffix or a negative `max_reconsume_times`."""
    from mqstore.engine.record_decode import RecordFields  # the decoded side: loaded at first use

    if not isinstance(message, RecordFields):
        _wrong("send_back() argument 'message'", "a message as pull() returns it", message)
    check_types(
        "send_back", group=(group, STR), delay_level=(delay_level, INT),
        max_reconsume_times=(max_times, INT),
    )  # fmt: skip
    assert isinstance(group, str) and isinstance(max_times, int)
    why = topic_problem("%RETRY%" + group) if group else "group name is empty"
    if why is not None:
        raise ValueError(f"send_back() group {group!r}: {why}")
    if max_times < 0:
        raise ValueError(f"send_back() max_reconsume_times {max_times} is negative")
