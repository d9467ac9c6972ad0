"""`mqstore topic DIR list`, `mqstore topic DIR set T --queues N`, `mqstore topic DIR
delete T` (the action may also come first: `mqstore topic delete DIR T`).

Topics live in `config/topics.json` (RocketMQ's TopicConfigManager form). A topic is
written there with the default queue count (`default_topic_queue_nums`) by the dispatcher
when its first message is dispatched; `set` changes (or creates) a topic's read and write
queue counts, which producers use to spread puts without a queue id. `list` shows the
configured topics and the queues the consume queues hold.

`delete` (mqadmin's deleteTopic) removes T's consume queues, its config and every group's
committed offsets of it; its records stay in the commit log until retention removes them,
but are no longer readable through the queues, also after a restart or a crash
(`engine.deleted_topics`). Messages put to T afterwards make a new topic, from queue offset
0. On a stopped store it is done here, and refused after an unclean stop (`mqstore recover
DIR` first), since it must know where the log ends. On a running store it is asked of the
store's dispatcher (`workers.topic_delete`: the log's end taken under the reservation
lock, producers' queue rows reset in place, readers told through the control block) and
this waits for it to be done, up to `--timeout` seconds (60); one deletion at a time.
Exit 0, 1 when refused or not done in time (the request stays and is served when the
dispatcher runs), 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from pathlib import Path

from mqstore.conf.load import ConfigError, load_settings
from mqstore.engine import deleted_topics, fileio, topics
from mqstore.engine.reader import Geometry
from mqstore.engine.storedir import ABORT_FILE
from mqstore.ipc.locks import StoreLockHeld, take_store_lock
from mqstore.workers.commands._common import action_first, add_action_arguments, topic_arg

NAME = "topic"
HELP = "list topics, set a topic's queue count, or delete a topic"
ACTIONS = ("list", "set", "delete")


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_action_arguments(p, ACTIONS)
    p.add_argument(
        "topic", nargs="?", default=None, type=topic_arg, help="with set and delete: the topic"
    )
    p.add_argument("--queues", type=int, default=None, metavar="N", help="with set")
    p.add_argument("--config", type=Path, default=None, help="with delete: settings")
    p.add_argument(
        "--timeout", type=float, default=60.0, metavar="S",
        help="with delete on a running store: how long to wait for it (60)",
    )  # fmt: skip


def _queue_dirs(store_dir: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    root = store_dir / "consumequeue"
    with contextlib.suppress(OSError):
        for t in os.listdir(root):
            with contextlib.suppress(OSError):
                out[t] = sum(1 for q in os.listdir(root / t) if q.isdigit())
    return out


def _delete(args: argparse.Namespace) -> int:
    store = str(args.store_dir)
    if args.topic is None:
        print("mqstore topic: delete needs a topic", file=sys.stderr)
        return 2
    if not (args.store_dir / "commitlog").is_dir():
        print(f"mqstore topic: {store} is not a store (no commitlog/)", file=sys.stderr)
        return 2
    try:
        settings = load_settings(args.store_dir, args.config, os.environ).settings
        lock_fd = take_store_lock(store)  # no supervisor may start while we delete
    except StoreLockHeld:
        return _delete_running(args)
    except ConfigError as e:
        print(f"mqstore topic: {e}", file=sys.stderr)
        return 2
    try:
        if os.path.exists(os.path.join(store, ABORT_FILE)):
            print(
                f"mqstore topic: refused: {store} did not stop cleanly; "
                f"run `mqstore recover {store}` first",
                file=sys.stderr,
            )
            return 1
        seg = Geometry.of(store, settings).segment_size_bytes
        done = deleted_topics.delete_topic(store, args.topic, seg)
    except (ValueError, fileio.StoreIOError) as e:
        print(f"mqstore topic: {e}", file=sys.stderr)
        return 2
    finally:
        os.close(lock_fd)
    _report(done, "")
    return 0


def _report(done: deleted_topics.DeletedTopic, how: str) -> None:
    print(
        f"deleted topic {done.topic}{how}: {done.queue_files} consume-queue file(s), "
        f"{done.offsets_removed} committed offset(s); its records below log offset "
        f"{done.end_offset} stay out of the queues"
    )


def _delete_running(args: argparse.Namespace) -> int:
    """The store runs: ask its dispatcher, wait for the answer."""
    store = str(args.store_dir)
    if not args.timeout > 0:
        print("mqstore topic: --timeout must be > 0", file=sys.stderr)
        return 2
    try:
        rid = deleted_topics.request(store, args.topic)
    except ValueError as e:
        print(f"mqstore topic: refused: {e}", file=sys.stderr)
        return 1
    except fileio.StoreIOError as e:
        print(f"mqstore topic: {e}", file=sys.stderr)
        return 2
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline:
        try:
            req = deleted_topics.read_request(store)
        except ValueError as e:
            print(f"mqstore topic: {e}", file=sys.stderr)
            return 1
        if req is not None and req.id == rid and req.done and req.result is not None:
            _report(req.result, " (the store is running)")
            return 0
        time.sleep(0.02)
    print(
        f"mqstore topic: the running store did not delete {args.topic} within "
        f"{args.timeout:g} s (is its dispatcher running? see `mqstore status {store}`); "
        "the request stays and is served when the dispatcher runs",
        file=sys.stderr,
    )
    return 1


def run(args: argparse.Namespace) -> int:
    if not action_first(args, ACTIONS):
        print(f"mqstore topic: ACTION must be one of {', '.join(ACTIONS)}", file=sys.stderr)
        return 2
    if not args.store_dir.is_dir():
        print(f"mqstore topic: {args.store_dir} is not a directory", file=sys.stderr)
        return 2
    if args.action == "delete":
        return _delete(args)
    if args.action == "set":
        if args.topic is None or args.queues is None:
            print("mqstore topic: set needs a topic and --queues N", file=sys.stderr)
            return 2
        try:
            cfg = topics.set_queue_nums(args.store_dir, args.topic, args.queues)
        except (ValueError, fileio.StoreIOError) as e:
            print(f"mqstore topic: {e}", file=sys.stderr)
            return 2
        print(f"{cfg.topic}: {cfg.write_queue_nums} queues")
        return 0
    try:
        configured = topics.load_topics(args.store_dir)
    except ValueError as e:
        print(f"mqstore topic: config/topics.json: {e}", file=sys.stderr)
        return 2
    on_disk = _queue_dirs(args.store_dir)
    print(f"{'topic':<32} {'read':>5} {'write':>5} {'perm':>4} {'queues on disk':>14}")
    for name in sorted(set(configured) | set(on_disk)):
        tc = configured.get(name)
        r, w, perm = (
            ("-", "-", "-") if tc is None else (tc.read_queue_nums, tc.write_queue_nums, tc.perm)
        )
        print(f"{name:<32} {r!s:>5} {w!s:>5} {perm!s:>4} {on_disk.get(name, 0):>14}")
    return 0
