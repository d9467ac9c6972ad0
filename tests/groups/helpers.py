"""Helpers of the group tests: member processes, their logs, the coordinator's view."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mqstore.ipc import channel
from tests.runtime.harness import REPO, wait_for


def info(store: Path, group: str) -> dict[str, Any]:
    got: dict[str, Any] = channel.request(store, {"op": "group_info"})["groups"].get(group, {})
    return got


def owners(store: Path, group: str, topic: str) -> dict[int, str | None]:
    """queue id -> the member id holding an active grant of it (None: nobody)."""
    out: dict[int, str | None] = {}
    for q in info(store, group).get("queues", []):
        if q["topic"] == topic:
            out[q["queue_id"]] = q["owner"] if q["state"] == "active" else None
    return out


@dataclass
class Member:
    proc: subprocess.Popen[bytes]
    log: Path
    member_id: str = ""
    killed: bool = False

    def wait_joined(self) -> str:
        def joined() -> str | None:
            if self.log.exists():
                for line in self.log.read_text().splitlines():
                    if line.startswith("J "):
                        return line[2:]
            assert self.proc.poll() is None, f"member exited with {self.proc.returncode}"
            return None

        self.member_id = wait_for(joined, 60, "a member to join")
        return self.member_id

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self.killed = True

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(60)


def spawn_member(store: Path, group: str, topic: str, log: Path, *args: str) -> Member:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.groups.member", str(store), group, topic, str(log), *args],
        env=env,
        cwd=str(REPO),
    )
    return Member(proc, log)


def spawn_producer(
    store: Path, topic: str, tag: str, count: int, log: Path, *args: str
) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [
            sys.executable, "-m", "tests.groups.producer", str(store), topic, tag,
            str(count), str(log), *args,
        ],
        env=env,
        cwd=str(REPO),
    )  # fmt: skip


@dataclass
class Processed:
    """What members' logs say: every processing (P) and ack (A) of each body."""

    by_body: dict[str, list[tuple[int, int]]] = field(default_factory=dict)  # (member, ns)
    acked: list[set[str]] = field(default_factory=list)  # per member log
    lines: list[list[str]] = field(default_factory=list)

    @classmethod
    def read(cls, logs: list[Path]) -> Processed:
        out = cls()
        for i, log in enumerate(logs):
            acked: set[str] = set()
            text = log.read_text() if log.exists() else ""
            for line in text.splitlines():
                parts = line.split(" ")
                if parts[0] == "P" and len(parts) == 7:
                    out.by_body.setdefault(parts[4], []).append((i, int(parts[6])))
                elif parts[0] == "A" and len(parts) == 2:
                    acked.add(parts[1])
            out.acked.append(acked)
        return out

    def duplicates(self) -> dict[str, list[tuple[int, int]]]:
        """Bodies processed more than once, each with its processings in time order."""
        return {b: sorted(ps, key=lambda p: p[1]) for b, ps in self.by_body.items() if len(ps) > 1}


def produced(logs: list[Path]) -> list[str]:
    out: list[str] = []
    for log in logs:
        lines = log.read_text().splitlines()
        assert lines and lines[-1] == "D", f"{log} is not complete"
        out.extend(lines[:-1])
    return out


def wait_processed(logs: list[Path], want: set[str], timeout_s: float) -> Processed:
    """Read the logs every 0.2 s until every body of `want` was processed."""
    deadline = time.monotonic() + timeout_s
    while True:
        p = Processed.read(logs)
        missing = want - p.by_body.keys()
        if not missing:
            return p
        if time.monotonic() > deadline:
            raise AssertionError(
                f"timed out after {timeout_s} s: {len(missing)} of {len(want)} messages "
                f"never processed, e.g. {sorted(missing)[:5]}"
            )
        time.sleep(0.2)


def first_membership(log: Path) -> list[str]:
    """Bodies a member processed before it first joined again (its `R` line): what it
    delivered under its first membership."""
    out: list[str] = []
    for line in log.read_text().splitlines():
        if line.startswith("R "):
            break
        parts = line.split(" ")
        if parts[0] == "P" and len(parts) == 7:
            out.append(parts[4])
    return out


def refused(log: Path) -> set[str]:
    """Bodies whose ack the member was refused (`X`: its lease was over)."""
    return {line[2:] for line in log.read_text().splitlines() if line.startswith("X ")}


def acked_twice(p: Processed) -> list[str]:
    """Bodies acked by two members: the duplicates the group promises never to make (a
    member's ack is accepted only while its lease holds, and the next owner starts past
    it). Any other duplicate is at-least-once: a delivery whose ack was refused or never
    made, redelivered by the queue's next owner."""
    return sorted(b for b in p.by_body if sum(b in acked for acked in p.acked) > 1)
