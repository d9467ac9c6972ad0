"""`bench.sync_floor`: its arithmetic, and a tiny null-store run in the checks' shape that
answers every put and leaves nothing behind. Nothing here checks speed."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import psutil
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench import sync_floor


def test_check_rate_is_every_put_over_the_slowest_loop() -> None:
    assert sync_floor.check_rate(2, 100, [0.5, 2.0]) == 100.0
    assert sync_floor.check_rate(1, 600, [3.0]) == 200.0
    with pytest.raises(ValueError, match="3 loop times for 2 clients"):
        sync_floor.check_rate(2, 100, [1.0, 1.0, 1.0])
    with pytest.raises(ValueError):
        sync_floor.check_rate(0, 100, [])


def test_without_ctypes_scales_the_rate_as_the_cpu_goes_down() -> None:
    rate, cpu = sync_floor.without_ctypes(30_000.0, 40.0, 10.0)
    assert cpu == 30.0
    assert rate == pytest.approx(40_000.0)
    assert sync_floor.without_ctypes(1.0, 5.0, 0.0) == (1.0, 5.0)
    for bad in (-1.0, 40.0, 41.0):
        with pytest.raises(ValueError, match="not within the CPU per put"):
            sync_floor.without_ctypes(30_000.0, 40.0, bad)


@given(st.lists(st.tuples(st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1)), max_size=70))
def test_changed_slots_are_the_slots_that_differ(pairs: list[tuple[int, int]]) -> None:
    snap = struct.pack(f"={len(pairs)}I", *(a for a, _ in pairs))
    old = struct.pack(f"={len(pairs)}I", *(b for _, b in pairs))
    assert sync_floor.changed_slots(snap, old) == [i for i, (a, b) in enumerate(pairs) if a != b]


def test_changed_slots_refuses_slots_of_other_sizes() -> None:
    with pytest.raises(ValueError, match="slots of 8 and 4 bytes"):
        sync_floor.changed_slots(bytes(8), bytes(4))
    with pytest.raises(ValueError, match="slots of 6 and 6 bytes"):
        sync_floor.changed_slots(bytes(6), bytes(6))


def test_verdict_says_whether_the_null_store_meets_the_goal() -> None:
    assert sync_floor.verdict(1.97, 2.5) == (
        "1.97 < 2.5: not even this null store meets the goal here"
    )
    assert sync_floor.verdict(3.0, 2.5) == "3.00 >= 2.5: this null store meets it, by 1.20x"


def test_puts_for_is_the_checks_n() -> None:
    assert [sync_floor.puts_for(w) for w in (1, 2, 16, 17, 64)] == [6000, 2000, 2000, 600, 600]


@pytest.mark.parametrize("kind", sync_floor.KINDS)
def test_a_null_run_answers_every_put_and_cleans_up(tmp_path: Path, kind: str) -> None:
    """Three clients started as the checks start theirs, 40 puts each: every put PUT_OK
    (null_run raises otherwise), rounds made, its shared memory and files gone."""
    shm = {n for n in os.listdir("/dev/shm") if n.startswith("syncfloor-")}
    # children of the test process started before (multiprocessing's resource tracker,
    # once an earlier test made shared memory) are not this run's
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    run = sync_floor.null_run(tmp_path, 3, 40, kind)
    assert run.rate > 0 and run.rounds >= 1
    assert run.ctypes_calls() > 0
    assert {n for n in os.listdir("/dev/shm") if n.startswith("syncfloor-")} == shm
    assert list(tmp_path.iterdir()) == []
    assert [p for p in psutil.Process().children(recursive=True) if p.pid not in before] == []


def test_a_null_run_refuses_an_unknown_kind_and_too_many_clients(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not one of"):
        sync_floor.null_run(tmp_path, 2, 10, "fsync")
    with pytest.raises(ValueError, match="producers"):
        sync_floor.null_run(tmp_path, sync_floor.MAX_WORKERS + 1, 10, "null")
    assert list(tmp_path.iterdir()) == []


def test_store_figures_reads_a_profile_sync_check_run() -> None:
    text = (
        "== 16 clients x 2000 puts, pool on, load at start 15.63, at end 15.66\n"
        "  check's rate 29,568 puts/s (slowest loop 1.08 s); not PUT_OK 0; shm left 0\n"
        "  CPU per put (µs): clients' loops 33.6 (run-queue delay 224.1, switches 1.33); "
        "store's processes over the whole run 19.4:\n"
    )
    assert sync_floor.store_figures(text) == (29568.0, 33.6, 19.4)
    with pytest.raises(ValueError, match="not a profile_sync_check run"):
        sync_floor.store_figures("== 16 clients x 2000 puts\n")
