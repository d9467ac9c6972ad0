"""Invariants on a stopped store after crashes: what was acknowledged is there exactly
once with its content, nothing appears that was never put, the consume queues serve the
same records as the log, and `mqstore check` finds no ERROR."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mqstore.engine.filler import is_filler
from mqstore.engine.reader import GetStatus, StoreReader
from mqstore.engine.record import PROPERTY_KEYS, PROPERTY_TAGS, DecodedRecord
from tests.reliability.workload import MAX_BATCH, Acks, message, parse_body
from tests.runtime.harness import REPO, Store, check_chain


@dataclass
class Outcome:
    records: int = 0
    sync_acked: int = 0
    async_acked: int = 0
    sync_lost: list[str] = field(default_factory=list)
    async_lost: int = 0
    problems: list[str] = field(default_factory=list)


def run_check(path: Path) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "mqstore", "check", str(path), "--json"],
        capture_output=True, text=True, cwd=str(REPO), timeout=300,
    )  # fmt: skip
    assert out.returncode in (0, 1), out.stderr
    doc: dict[str, Any] = json.loads(out.stdout)
    return doc


def check_errors(path: Path) -> list[str]:
    doc = run_check(path)
    return [f"{f['what']} @ {f['offset']}" for f in doc["findings"] if f["severity"] == "ERROR"]


def queue_view(path: Path) -> dict[tuple[str, int], list[int]]:
    """Physical offsets served through the consume queues, per (topic, queue id)."""
    got: dict[tuple[str, int], list[int]] = {}
    with StoreReader.open(path) as rd:
        for topic, qid in rd.queues.keys():  # noqa: SIM118 (iterating yields queues)
            offs: list[int] = []
            off = rd.min_offset(topic, qid)
            while True:
                res = rd.get_messages(topic, qid, off, 256)
                if res.status not in (GetStatus.FOUND, GetStatus.NO_MATCHED_MESSAGE):
                    break
                for r in res.messages:
                    offs.append(r.physical_offset)
                if res.next_offset <= off:
                    break
                off = res.next_offset
            got[(topic, qid)] = offs
    return got


def record_matches(r: DecodedRecord, tag: str, i: int) -> str:
    want = message(tag, i)
    if r.body != want["body"]:
        return "body differs"
    if r.topic != want["topic"] or r.queue_id != want["queue_id"]:
        return f"placed in {r.topic}/{r.queue_id}, expected {want['topic']}/{want['queue_id']}"
    if r.properties.get(PROPERTY_TAGS) != want["tags"]:
        return "tags differ"
    if r.properties.get(PROPERTY_KEYS) != want["keys"]:
        return "keys differ"
    return ""


def verify(store: Store, acks: dict[str, Acks], *, async_loss_allowed: bool) -> Outcome:
    """Check every invariant on the stopped `store`; problems are listed, not raised."""
    o = Outcome()
    seg = int(store.config["segment_size_bytes"])
    all_recs = store.read_log(keep_fillers=True)
    try:
        check_chain(all_recs, seg)
    except AssertionError as e:
        o.problems.append(f"log chain: {e}")
    recs = [r for r in all_recs if not is_filler(r)]
    o.records = len(recs)
    seen: Counter[tuple[str, int]] = Counter()
    where: dict[tuple[str, int], int] = {}
    for r in recs:
        key = parse_body(r.body)
        if key is None or key[0] not in acks:
            o.problems.append(f"record at {r.physical_offset} was never put: {r.body[:40]!r}")
            continue
        if key[1] > acks[key[0]].highest + MAX_BATCH:
            o.problems.append(f"record {key} at {r.physical_offset} beyond anything put")
        bad = record_matches(r, *key)
        if bad:
            o.problems.append(f"record {key} at {r.physical_offset}: {bad}")
        seen[key] += 1
        where[key] = r.physical_offset
    o.problems += [f"{k} stored {n} times" for k, n in seen.items() if n > 1]
    for tag, a in acks.items():
        o.sync_acked += len(a.sync)
        o.async_acked += len(a.asyn)
        for i, off in a.sync.items():
            if (tag, i) not in seen:
                o.sync_lost.append(f"{tag}/{i}@{off}")
            elif where[(tag, i)] != off:
                o.problems.append(f"{tag}/{i} acknowledged at {off}, found at {where[(tag, i)]}")
        for i, off in a.asyn.items():
            if (tag, i) not in seen:
                o.async_lost += 1
            elif where[(tag, i)] != off:
                o.problems.append(f"{tag}/{i} acknowledged at {off}, found at {where[(tag, i)]}")
    if o.async_lost and not async_loss_allowed:
        o.problems.append(f"{o.async_lost} async-acknowledged messages lost")
    o.problems += [f"mqstore check: {e}" for e in check_errors(store.path)]
    return o


def verify_queues(store: Store) -> list[str]:
    """The consume queues serve exactly the log's records, queue by queue (run after a
    start: recovery re-dispatches what the last run's dispatcher had not)."""
    problems: list[str] = []
    recs = store.read_log()
    by_queue: dict[tuple[str, int], list[int]] = {}
    for r in sorted(recs, key=lambda r: r.physical_offset):
        by_queue.setdefault((r.topic, r.queue_id), []).append(r.physical_offset)
    served = queue_view(store.path)
    for q, offs in by_queue.items():
        if served.get(q, []) != offs:
            got = served.get(q, [])
            problems.append(
                f"consume queue {q} serves {len(got)} records, the log has {len(offs)}"
                f"; not served: {sorted(set(offs) - set(got))[:5]}"
                f", not in the log: {sorted(set(got) - set(offs))[:5]}"
            )
    return problems
