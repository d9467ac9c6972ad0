"""Topic and consumer-group names: RocketMQ's rule, checked in one place.

A topic name becomes a directory (`consumequeue/<topic>/<queueId>/`) and a key of
`config/topics.json`; a group name becomes part of `config/consumerOffset.json`'s
`topic@group` keys. RocketMQ (`TopicValidator.validateTopic`, `Validators.checkGroup`)
allows only `^[%|a-zA-Z0-9_-]+$`, a topic of at most 127 characters and a group of at
most 255, so no name can be `.`, `..`, hold a `/`, a space, a control character or an
`@`, and none can form a path outside its directory. mqstore applies the same rule:

* the client refuses a put to a bad topic with MESSAGE_ILLEGAL and this reason, before
  anything is reserved (`ipc.client`);
* reads, offset commits and every CLI command that takes a topic or a group raise
  ValueError / exit 2 with it;
* the dispatcher and the consume-queue store never make a directory for a bad name
  (defence in depth: a store written by an older mqstore or by another writer may hold
  one), and `config/topics.json` never gets one.

`topic_problem` / `group_problem` return the reason (or None) and cost one regex match;
`check_topic` / `check_group` raise ValueError with it. The future C put path mirrors
`topic_problem` (same character set, same limit).
"""

from __future__ import annotations

import re
from typing import Final

TOPIC_MAX_CHARS: Final = 127  # TopicValidator.TOPIC_MAX_LENGTH
GROUP_MAX_CHARS: Final = 255  # Validators.CHARACTER_MAX_LENGTH
_VALID: Final = re.compile(r"[%|a-zA-Z0-9_-]+")
RULE: Final = "only letters, digits, '%', '|', '_' and '-' (RocketMQ's ^[%|a-zA-Z0-9_-]+$)"


def _problem(kind: str, name: object, max_chars: int) -> str | None:
    if not isinstance(name, str):
        return f"{kind} name must be a str, not {type(name).__name__}"
    if not name:
        return f"{kind} name is empty"
    if len(name) > max_chars:
        return f"{kind} name is {len(name)} characters; at most {max_chars} are allowed"
    if _VALID.fullmatch(name) is None:
        return f"{kind} name {name!r} is not allowed: {RULE}"
    return None


def topic_problem(topic: object) -> str | None:
    """Why `topic` cannot name a topic, or None when it can. O(len(topic))."""
    return _problem("topic", topic, TOPIC_MAX_CHARS)


def group_problem(group: object) -> str | None:
    """Why `group` cannot name a consumer group, or None when it can."""
    return _problem("consumer group", group, GROUP_MAX_CHARS)


def check_topic(topic: object) -> None:
    """Raise ValueError with `topic_problem`'s reason for a bad topic name."""
    why = topic_problem(topic)
    if why is not None:
        raise ValueError(why)


def check_group(group: object) -> None:
    """Raise ValueError with `group_problem`'s reason for a bad group name."""
    why = group_problem(group)
    if why is not None:
        raise ValueError(why)
