"""What a put accepts: the validate step of `StoreClient.put` / `put_batch`, apart from
encoding and reserving.

Each check returns the reason a value cannot be stored (a `MESSAGE_ILLEGAL` status for
the caller) or raises TypeError for an argument of the wrong Python type, naming the
parameter. The client calls them before it reserves anything, so a refused put writes
nothing; a native put path mirrors them rule for rule. Names are checked by
`engine.names`, properties by `engine.record.properties_problem`.
"""

from __future__ import annotations


def queue_id_problem(topic: str, queue_id: object, queues: int) -> str:
    """Why `queue_id` is not one of `topic`'s `queues` write queues. RocketMQ's broker
    refuses such a put ("queueId ... is illegal"): the unit would go to a queue no
    consumer of the topic reads, and a topic config cannot name it
    (`engine.topics.MAX_QUEUE_NUMS`)."""
    return (
        f"queue id {queue_id!r} is not one of topic {topic!r}'s {queues} queues "
        f"(0..{queues - 1}); `mqstore topic DIR set {topic} --queues N` changes the count"
    )
