"""The dispatcher's pass over a scanned batch (`mqstore._native.scan_summary`) against its
Python twin (`engine.scan.scan_summary_py`), answer for answer.

Hypothesis draws batches of records with any store time (near now, far past, future, the
int64 extremes: the lag sum of hostile times passes 64 bits), any bits, sys flags and
queue ids, any bucket count, and columns of other lengths; both twins must give the same
flags, lag sum and counts, or the same ValueError.
"""

from __future__ import annotations

from array import array
from typing import NamedTuple

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqstore import _native
from mqstore.engine import scan
from mqstore.engine.scan import ScanSummary, SummaryColumn

NOW = 1_760_000_000_000
_I64 = st.integers(-(2**63), 2**63 - 1)
_I32 = st.integers(-(2**31), 2**31 - 1)
_record = st.tuples(
    st.one_of(st.integers(NOW - 100_000, NOW + 100), _I64),  # store time
    st.integers(0, 255),  # bits
    st.one_of(st.sampled_from([0, 0x4, 0x8, 0xC, 0x3]), _I32),  # sys flag
    st.one_of(st.integers(0, 7), _I32),  # queue id
)


class Cols(NamedTuple):
    store_timestamp: SummaryColumn
    bits: SummaryColumn
    sys_flag: SummaryColumn
    queue_id: SummaryColumn


def _both(cols: list[SummaryColumn], now_ms: int, buckets: int) -> list[object]:
    out: list[object] = []
    for f in (scan.scan_summary, scan.scan_summary_py):
        try:
            out.append(f(Cols(*cols), now_ms, buckets))
        except ValueError as e:
            out.append(str(e))
    return out


@settings(max_examples=400, deadline=None)
@given(
    st.lists(_record, max_size=80),
    st.one_of(st.just(NOW), _I64),
    st.one_of(st.sampled_from([0, 1, 18]), st.integers(-2, 70)),
)
def test_c_and_python_summarise_alike(
    recs: list[tuple[int, int, int, int]], now: int, b: int
) -> None:
    cols: list[SummaryColumn] = [array(code, [r[k] for r in recs]) for k, code in enumerate("qBii")]
    got_c, got_py = _both(cols, now, b)
    assert got_c == got_py


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(max_size=40), min_size=4, max_size=4), st.integers(0, 20))
def test_columns_of_other_lengths_are_refused_alike(raw: list[bytes], b: int) -> None:
    got_c, got_py = _both(list(raw), NOW, b)
    assert got_c == got_py


def test_plain_batch_and_lags() -> None:
    """A worked case: lags 0 (a future time), 1, 5 and 1000 ms fall in buckets 0, 1, 3, 10."""
    ts = array("q", [NOW + 7, NOW - 1, NOW - 5, NOW - 1000])
    got = scan.scan_summary(
        Cols(ts, bytes(4), array("i", [0, 8, 0, 8]), array("i", [0, 1, 2, 3])), NOW, 18
    )
    want = [0] * 18
    for bucket in (0, 1, 3, 10):
        want[bucket] += 1
    assert got == ScanSummary(0, 1006, tuple(want))
    assert _native.scan_summary(ts, bytes(4), bytes(16), bytes(16), NOW, 0) == (0, 0, ())


@pytest.mark.parametrize(
    ("bits", "sys_flag", "queue_id", "flags"),
    [
        (2, 0, 0, scan.SUMMARY_FILLER),
        (1, 0x4, 0, scan.SUMMARY_TX),
        (0, 0xC, -1, scan.SUMMARY_TX | scan.SUMMARY_NEG_QUEUE),
    ],
)
def test_flags_name_what_is_not_plain(bits: int, sys_flag: int, queue_id: int, flags: int) -> None:
    cols = Cols(array("q", [NOW]), bytes([bits]), array("i", [sys_flag]), array("i", [queue_id]))
    assert scan.scan_summary(cols, NOW, 0).flags == flags
