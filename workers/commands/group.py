"""`mqstore group DIR list|reset|delete`: consumer groups and their committed offsets.

    mqstore group DIR list [--json]
    mqstore group DIR describe --group G [--json]
    mqstore group DIR reset --group G --topic T --to earliest|latest|TIME [--dry-run] [--json]
    mqstore group DIR delete --group G [--topic T]

(`mqstore group list DIR ...`, action first, works too.) Offsets live in
`config/consumerOffset.json` (RocketMQ's ConsumerOffsetManager), on a running or a stopped
store alike. `list` shows each group's topics, queues and total lag (`mqstore offsets DIR
--group G` shows one group per queue). `reset` sets the group's offset in every queue of T
(its configured queues and those on disk) to the queue's first message (`earliest`), its
end (`latest`: only new messages), or the first message stored at or after TIME (ISO 8601
or epoch ms), as Kafka's `--reset-offsets` and mqadmin's `resetOffsetByTime` do; with
`--dry-run` it prints the new offsets and writes nothing. `delete` forgets the group's
offsets (of T only, with `--topic`), as mqadmin's `deleteSubGroup`.

`list` also shows how many members each running group has; `describe` shows one group's
members (id, pid, topics, seconds since their last beat) and, per queue, its owner, the
committed offset (the owner's lowest unacked one, live) and the lag; both ask the running
supervisor (`workers.group_coord`) and fall back to the offsets file alone.

`reset` works while the group's members (`StoreClient.consumer`, `mqstore tail --group
G`) run: the supervisor cancels their grants of the topic's queues (each member drops them
at its next beat, within 100 ms, and acks of what it delivered before no longer count) and
the queues are granted again from the new offsets. `delete` is refused while members of
the group run. A program that commits with `commit_offset` itself is not a member and is
not told: stop it first. Exit 0, 1 when refused, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from mqstore.engine import fileio, topics
from mqstore.engine.names import check_group
from mqstore.engine.offsets import NO_OFFSET, ConsumerOffsets
from mqstore.ipc import channel
from mqstore.workers.commands._common import action_first, add_action_arguments, parse_time_ms
from mqstore.workers.commands._reads import Reads, open_reads

NAME = "group"
HELP = "list or describe consumer groups, reset or delete a group's offsets"
ACTIONS = ("list", "describe", "reset", "delete")


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_action_arguments(p, ACTIONS)
    p.add_argument("--config", type=Path, default=None, help="settings (TOML or broker.conf)")
    p.add_argument("--group", default=None, metavar="G")
    p.add_argument("--topic", default=None, metavar="T")
    p.add_argument("--to", default=None, metavar="WHERE", help="earliest, latest or a time")
    p.add_argument("--dry-run", action="store_true", help="reset: show, write nothing")
    p.add_argument("--json", action="store_true", help="one JSON object per row")


def _fail(msg: str, code: int = 2) -> int:
    print(f"mqstore group: {msg}", file=sys.stderr)
    return code


def _print_rows(rows: list[dict[str, Any]], as_json: bool) -> None:
    if as_json:
        for r in rows:
            print(json.dumps(r))
        return
    if not rows:
        return
    head = list(rows[0])
    cells = [[str("-" if r[k] is None else r[k]) for k in head] for r in rows]
    widths = [max(len(x) for x in col) for col in zip(head, *cells, strict=False)]
    for line in [head, *cells]:
        print("  ".join(x.ljust(w) for x, w in zip(line, widths, strict=True)).rstrip())


def _running(store_dir: Path) -> dict[str, Any] | None:
    """The supervisor's view of the running groups (`group_info`), None when no
    supervisor runs."""
    try:
        got = channel.request(store_dir, {"op": "group_info"})
    except (channel.SupervisorUnavailable, OSError, ValueError):
        return None
    groups = got.get("groups")
    return groups if isinstance(groups, dict) else None


def _live_offsets(info: dict[str, Any]) -> dict[tuple[str, int], int]:
    return {
        (q["topic"], q["queue_id"]): q["offset"]
        for q in info.get("queues", [])
        if isinstance(q.get("offset"), int)
    }


def _list(
    table: dict[str, dict[tuple[str, int], int]],
    reads: Reads,
    as_json: bool,
    running: dict[str, Any] | None,
) -> int:
    rows = []
    running = running or {}
    for group in sorted(set(table) | set(running)):
        entries = {**table.get(group, {}), **_live_offsets(running.get(group, {}))}
        lag = sum(max(reads.max_offset(t, q) - off, 0) for (t, q), off in entries.items())
        members = [m for m in running.get(group, {}).get("members", []) if not m["gone"]]
        rows.append(
            {
                "group": group,
                "topics": ",".join(sorted({t for t, _q in entries})),
                "queues": len(entries),
                "lag": lag,
                "members": len(members),
            }
        )
    if not rows and not as_json:
        print("no consumer groups (config/consumerOffset.json is missing or empty)")
    _print_rows(rows, as_json)
    return 0


def _describe(
    args: argparse.Namespace,
    table: dict[str, dict[tuple[str, int], int]],
    reads: Reads,
    running: dict[str, Any] | None,
) -> int:
    info = (running or {}).get(args.group, {})
    committed = {**table.get(args.group, {}), **_live_offsets(info)}
    owner = {(q["topic"], q["queue_id"]): q["owner"] for q in info.get("queues", []) if q["owner"]}
    members = info.get("members", [])
    if not committed and not members:
        return _fail(f"no group {args.group!r} (no member runs, no committed offset)", 1)
    if args.json:
        for m in members:
            print(json.dumps({"member": m["id"], **{k: v for k, v in m.items() if k != "id"}}))
    else:
        if running is None:
            print("members: unknown (no supervisor runs)")
        else:
            print(f"members: {len(members)}")
        for m in members:
            state = " (gone: queues still leased)" if m["gone"] else ""
            print(
                f"  {m['id']}  pid {m['pid']}  topics {','.join(m['topics'])}  "
                f"last beat {m['last_beat_s']:.1f} s ago{state}"
            )
    rows = []
    for t, q in sorted(set(committed) | set(owner)):
        off = committed.get((t, q))
        end = reads.max_offset(t, q)
        rows.append(
            {
                "topic": t,
                "queue_id": q,
                "owner": owner.get((t, q)),
                "committed": off,
                "max_offset": end,
                "lag": None if off is None else max(end - off, 0),
            }
        )
    _print_rows(rows, args.json)
    return 0


def _target(reads: Reads, topic: str, q: int, to: str) -> int:
    if to == "earliest":
        return reads.min_offset(topic, q)
    if to == "latest":
        return reads.max_offset(topic, q)
    return reads.offset_for_time(topic, q, parse_time_ms(to))


def _reset(args: argparse.Namespace, offsets: ConsumerOffsets, reads: Reads) -> int:
    queues = sorted(topics.queue_ids(args.store_dir, args.topic))
    if not queues:
        return _fail(f"topic {args.topic!r} has no queues in {args.store_dir}")
    try:
        new = {q: _target(reads, args.topic, q, args.to) for q in queues}
    except argparse.ArgumentTypeError as e:
        return _fail(f"--to: {e}; or earliest, latest")
    rows = []
    for q in queues:
        now = offsets.committed(args.group, args.topic, q)
        rows.append(
            {
                "group": args.group,
                "topic": args.topic,
                "queue_id": q,
                "committed": None if now == NO_OFFSET else now,
                "new": new[q],
            }
        )
    told = ""
    if not args.dry_run:
        entries = [(args.topic, q, o) for q, o in new.items()]
        try:
            req = {
                "op": "group_reset",
                "group": args.group,
                "offsets": [list(e) for e in entries],
            }
            got = channel.request(args.store_dir, req)
        except (channel.SupervisorUnavailable, OSError, ValueError):
            got = {}
        if "error" in got:
            return _fail(f"refused by the supervisor: {got['error']}", 1)
        offsets.commit_many(args.group, entries)
        if got.get("running"):
            told = f"; {len(got.get('members', []))} running member(s) told"
    _print_rows(rows, args.json)
    what = "dry run, nothing written" if args.dry_run else "written" + told
    print(f"reset {args.group} on {args.topic} to {args.to}: {what}", file=sys.stderr)
    return 0


def _delete(args: argparse.Namespace, offsets: ConsumerOffsets) -> int:
    try:
        got = channel.request(args.store_dir, {"op": "group_delete", "group": args.group})
    except (channel.SupervisorUnavailable, OSError, ValueError):
        got = {}
    if got.get("busy"):
        return _fail(
            f"refused: group {args.group!r} has members running (e.g. `mqstore tail "
            f"--group {args.group}`); stop them, then try again",
            1,
        )
    if "error" in got:
        return _fail(f"refused by the supervisor: {got['error']}", 1)
    gone = offsets.delete(args.group, args.topic)
    scope = f" of topic {args.topic}" if args.topic else ""
    print(f"deleted {gone} committed offset(s) of group {args.group}{scope}")
    return 0


def run(args: argparse.Namespace) -> int:
    if not action_first(args, ACTIONS):
        return _fail(f"ACTION must be one of {', '.join(ACTIONS)}, not {args.action!r}")
    if args.action != "list":
        if args.group is None:
            return _fail(f"{args.action} needs --group G")
        try:
            check_group(args.group)
        except ValueError as e:
            return _fail(str(e))
    if args.action == "reset" and (args.topic is None or args.to is None):
        return _fail("reset needs --topic T and --to earliest|latest|TIME")
    offsets = ConsumerOffsets(args.store_dir)
    try:
        table = offsets.table()
    except ValueError as e:
        return _fail(f"config/consumerOffset.json: {e}")
    try:
        if args.action == "delete":
            if not (args.store_dir / "commitlog").is_dir():
                return _fail(f"{args.store_dir} is not a store (no commitlog/)")
            return _delete(args, offsets)
        reads = open_reads(f"{NAME} {args.action}", args.store_dir, args.config)
        if reads is None:
            return 2
        with reads:
            if args.action == "list":
                return _list(table, reads, args.json, _running(args.store_dir))
            if args.action == "describe":
                return _describe(args, table, reads, _running(args.store_dir))
            return _reset(args, offsets, reads)
    except (fileio.StoreIOError, ValueError) as e:
        return _fail(str(e))
