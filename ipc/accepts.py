"""What a put accepts: the validate step of `StoreClient.put` / `put_batch`, apart from
encoding and reserving.

Each check returns the reason a value cannot be stored (a `MESSAGE_ILLEGAL` status for
the caller) or raises TypeError for an argument of the wrong Python type, naming the
parameter. The client calls them before it reserves anything, so a refused put writes
nothing; a native put path mirrors them rule for rule. Names are checked by
`engine.names`, properties by `engine.record.properties_problem`.
"""

from __future__ import annotations

import dataclasses
from typing import Final

from mqstore.engine import record
from mqstore.engine.record import Message

Host = tuple[bytes, int, bool]  # engine.record.parse_host: address bytes, port, is IPv6
_BORN_V6: Final = int(record.SysFlag.BORNHOST_V6)
_STORE_V6: Final = int(record.SysFlag.STOREHOST_V6)
_MESSAGE_DEFAULTS: Final = {f.name: f.default for f in dataclasses.fields(Message)}


def queue_id_problem(topic: str, queue_id: object, queues: int) -> str:
    """Why `queue_id` is not one of `topic`'s `queues` write queues. RocketMQ's broker
    refuses such a put ("queueId ... is illegal"): the unit would go to a queue no
    consumer of the topic reads, and a topic config cannot name it
    (`engine.topics.MAX_QUEUE_NUMS`)."""
    return (
        f"queue id {queue_id!r} is not one of topic {topic!r}'s {queues} queues "
        f"(0..{queues - 1}); `mqstore topic DIR set {topic} --queues N` changes the count"
    )


# A field of `engine.record.Message` left at its default is "unset": the client fills it
# in (born time: now; store host: the store's). Any other value is written as given or
# the put is refused.
UNSET_BORN_TIMESTAMP: Final = _MESSAGE_DEFAULTS["born_timestamp"]
UNSET_STORE_HOST: Final = _MESSAGE_DEFAULTS["store_host"]
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
        shown = record.format_host(given_store[0], given_store[1])
        return f"store_host {shown} is not this store's ({store_host}): the store writes its own"
    want = (_BORN_V6 if born[2] else 0) | (_STORE_V6 if store[2] else 0)
    bits = sys_flag & (_BORN_V6 | _STORE_V6)
    if bits and bits != want:
        return (
            f"sys_flag host bits 0x{bits:02x} disagree with the hosts (born host IPv6: "
            f"{born[2]}, store host IPv6: {store[2]}); leave them 0 or set 0x{want:02x}"
        )
    return None
