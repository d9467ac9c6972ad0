"""What the reading commands say when they find nothing or cut their output.

Before, `get --physical-offset 131` (not where a record starts), `--physical-offset
999999999` and `get`/`query --key nope` exited 1 with no word; `get --key` printed 1
match where `query` printed 2 (`--count` defaulted to 1, silently); and the time range
was `--begin`/`--end` in `get` but `--begin-ms`/`--end-ms` in `query`. Now each says
in one line what it did not find (exit 1), says when it stopped at `--limit` and how to
get the rest, and both take `--limit` (default 32) and `--begin`/`--end`; the old
spellings still work and say which to use."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from mqstore.workers.cli import main

StoreCopy = Callable[[str], Path]
KEY = "v1-upgrade-key"  # the rust store's two messages (physical offsets 0 and 141) carry it
TOPIC = "V1UpgradeTopic"


@pytest.fixture
def store(real_store_copy: StoreCopy) -> str:
    return str(real_store_copy("rocketmq-rust-0.9-store"))


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, list[int], list[str]]:
    """(exit code, physical offsets printed, stderr lines) of `mqstore ARGS`."""
    code = main(list(args))
    out, err = capsys.readouterr()
    offsets = [json.loads(line)["physical_offset"] for line in out.splitlines()]
    return code, offsets, err.splitlines()


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["get", "--physical-offset", "131"], "no message starts at physical offset 131"),
        (["get", "--physical-offset", "999999999"], "at physical offset 999999999"),
        (["get", "--topic", TOPIC, "--key", "nope"], f"no message of topic {TOPIC} carries"),
        (["query", "--topic", TOPIC, "--key", "nope"], f"no message of topic {TOPIC} carries"),
        (["get", "--msg-id", "7F00000100002A9F" + f"{131:016X}"], "no message with id"),
        (["get", "--topic", TOPIC, "--queue", "0", "--offset", "5"], "no message in"),
        (["get", "--topic", "Other", "--queue", "0", "--offset", "0"], "no message in"),
    ],
)
def test_nothing_found_says_so_in_one_line_and_exits_1(
    store: str, capsys: pytest.CaptureFixture[str], args: list[str], says: str
) -> None:
    code, printed, err = _run(capsys, args[0], store, *args[1:])
    assert (code, printed) == (1, [])
    said = [line for line in err if line.startswith(f"mqstore {args[0]}: ")]
    assert len(said) == 1 and says in said[0], err


def test_get_and_query_print_the_same_by_default(
    store: str, capsys: pytest.CaptureFixture[str]
) -> None:
    for cmd in ("get", "query"):
        assert _run(capsys, cmd, store, "--topic", TOPIC, "--key", KEY) == (0, [0, 141], [])


@pytest.mark.parametrize("cmd", ["get", "query"])
def test_a_cut_result_says_so_and_how_to_get_the_rest(
    store: str, capsys: pytest.CaptureFixture[str], cmd: str
) -> None:
    code, printed, err = _run(capsys, cmd, store, "--topic", TOPIC, "--key", KEY, "--limit", "1")
    assert (code, printed) == (0, [0])
    assert err == [f"mqstore {cmd}: stopped at --limit 1; more messages carry the key"]
    assert _run(capsys, cmd, store, "--topic", TOPIC, "--key", KEY, "--limit", "2")[2] == []


def test_a_cut_queue_read_names_the_next_offset(
    store: str, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["get", store, "--topic", TOPIC, "--queue", "0", "--offset", "0", "--limit", "1"]
    code, printed, err = _run(capsys, *args)
    assert (code, printed) == (0, [0])
    assert "mqstore get: stopped at --limit 1; the queue goes on: --offset 1 for the next" in err


@pytest.mark.parametrize("cmd", ["get", "query"])
def test_one_spelling_for_times_and_limits_the_old_ones_deprecated(
    store: str, capsys: pytest.CaptureFixture[str], cmd: str
) -> None:
    base = [cmd, store, "--topic", TOPIC, "--key", KEY]
    later = "2100-01-01T00:00"  # after both messages were stored
    assert _run(capsys, *base, "--begin", later)[:2] == (1, [])
    assert _run(capsys, *base, "--begin", "0", "--end", later)[:2] == (0, [0, 141])
    old_limit = {"get": "--count", "query": "--max"}[cmd]
    code, printed, err = _run(capsys, *base, old_limit, "1")
    assert (code, printed) == (0, [0])
    assert f"mqstore {cmd}: {old_limit} is deprecated, use --limit" in err
    if cmd == "query":
        code, printed, err = _run(capsys, *base, "--begin-ms", later)
        assert (code, printed) == (1, [])
        assert "mqstore query: --begin-ms is deprecated, use --begin" in err


def test_dump_cut_at_its_limit_says_where_the_rest_starts(
    store: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, printed, err = _run(capsys, "dump", store, "--limit", "1")
    assert (code, printed) == (0, [0])
    assert err == ["mqstore dump: stopped at --limit 1; --from-offset 141 for the rest"]
    assert _run(capsys, "dump", store, "--from-offset", "141") == (0, [141], [])
    assert _run(capsys, "dump", store, "--limit", "2") == (0, [0, 141], [])
