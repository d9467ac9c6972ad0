"""Every hand-written byte offset agrees with the layout table it stands for.

The tables are the ones in the code: the record layout in `engine/record.py`'s docstring
(read here for IPv4 hosts, BH = SH = 8) and the control block's in `ipc/control.py`'s.
`workers/metrics.py` once read SYSFLAG and STORETIMESTAMP at 32 and 52 instead of 36 and
56, so `mqstore_oldest_message_age_seconds` showed ~1.8e9 s. Any `unpack_from` /
`pack_into` in `workers/`, `ipc/` or `pipeline/` whose offset has a number in it must be
listed in `PINS` with the field it means, and the number must be that field's offset.
"""

from __future__ import annotations

import ast
import re
import struct
from pathlib import Path

from mqstore.engine import record
from mqstore.ipc import control

REPO = Path(__file__).resolve().parent.parent.parent
SCANNED = ("workers", "ipc", "pipeline")


def _record_table() -> dict[str, int]:
    """{FIELD: offset} from the record docstring, IPv4 born and store hosts."""
    table = {}
    for line in (record.__doc__ or "").splitlines():
        m = re.match(r"^(\d+(?:\+BH)?(?:\+SH)?)\s+\S+\s+([A-Z][A-Za-z ]*?)\s{2,}", line)
        if m:
            off = eval(m.group(1).replace("BH", "8").replace("SH", "8"))  # "48+8"
            table[m.group(2)] = int(off)
    return table


def _control_header() -> dict[str, int]:
    """{field: offset} from the control block's header table."""
    rows = re.findall(r"^\| (\d+) +\| (\w+)", control.__doc__ or "", flags=re.M)
    return {name: int(off) for off, name in rows}


def _row_offsets(fmt: str, names: list[str]) -> dict[str, int]:
    """Offsets of a struct row's fields, in order (`fmt` has one code per field)."""
    codes = re.findall(r"\d*[a-zA-Z]", fmt.lstrip("<>=!@"))
    assert len(codes) == len(names), (fmt, names)
    return {n: struct.calcsize(fmt[0] + "".join(codes[:i])) for i, n in enumerate(names)}


def _doc_row_names(what: str) -> list[str]:
    """Field names of a control-block row as its docstring lists them ("(pid, ...)")."""
    m = re.search(rf"{what}[^(]*\(([^)]*)\)", control.__doc__ or "", flags=re.S)
    assert m, what
    return [f.split()[0] for f in m.group(1).replace("\n", " ").split(",")]


RECORD = _record_table()
HEADER = _control_header()
WORKER_ROW = _row_offsets(control._WORKER.format, _doc_row_names("Workers table"))
QUEUE_ROW = _row_offsets(control.QROW_HEAD.format, _doc_row_names("Queue table")[:4])

# (file, enclosing function, number in the offset) -> the offset it must equal.
PINS: dict[tuple[str, str, int], int] = {
    ("ipc/control.py", "queue_rows", 20): QUEUE_ROW["topic_len"],
}


def test_the_named_row_offsets_match_the_tables() -> None:
    """The worker row's and queue row's fields stored one word each (`control.words`)."""
    assert WORKER_ROW == {
        "pid": control.WORKER_PID_OFF,
        "heartbeat_ms": control.WORKER_HB_OFF,
        "restarts": control.WORKER_RESTARTS_OFF,
        "state": control.WORKER_STATE_OFF,
        "name": control.WORKER_NAME_OFF,
    }
    assert QUEUE_ROW["next_offset"] == control.QROW_NEXT_OFF


def _literal_offsets() -> set[tuple[str, str, int]]:
    found = set()
    for top in SCANNED:
        for path in sorted((REPO / top).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            for fn in ast.walk(tree):
                if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                    continue
                for call in ast.walk(fn):
                    if not (
                        isinstance(call, ast.Call)
                        and isinstance(call.func, ast.Attribute)
                        and call.func.attr in ("unpack_from", "pack_into")
                        and len(call.args) >= 2
                    ):
                        continue
                    for node in ast.walk(call.args[1]):
                        if isinstance(node, ast.Constant) and type(node.value) is int:
                            found.add((str(path.relative_to(REPO)), fn.name, node.value))
    return found


def test_the_tables_parse() -> None:
    assert RECORD["TOTALSIZE"] == 0 and RECORD["PHYSICALOFFSET"] == 28
    assert len(RECORD) == 16, RECORD
    assert HEADER["magic_version"] == 0 and HEADER["nonce"] == 480
    assert WORKER_ROW == {"pid": 0, "heartbeat_ms": 8, "restarts": 16, "state": 24, "name": 32}


def test_every_literal_offset_is_pinned_to_its_table() -> None:
    found = _literal_offsets()
    assert found - PINS.keys() == set(), "an offset that is not pinned: name it or pin it"
    assert PINS.keys() - found == set(), "a pin with nothing left to pin: remove it"
    for (path, fn, number), want in PINS.items():
        assert number == want, f"{path}:{fn}: {number} is not the table's {want}"


def test_the_named_record_offsets_match_the_table() -> None:
    names = {"MAGIC": "MAGICCODE"}
    consts = {n[4:]: getattr(record, n) for n in dir(record) if n.startswith("POS_")}
    assert consts
    for name, off in consts.items():
        assert RECORD[names.get(name, name)] == off, name
    assert record.store_timestamp_pos(0) == RECORD["STORETIMESTAMP"] == 56
    v6 = int(record.SysFlag.BORNHOST_V6)
    assert record.store_timestamp_pos(v6) == RECORD["BORNHOST"] + 20


def test_the_packed_ipv4_headers_match_the_table() -> None:
    """The encoder's packed header: one struct code per field, the two host fields split
    into address and port. (The put path's header is written in C, engine/native/mqs_record.c;
    tests/native/test_record_diff.py compares its bytes with this encoder's.)"""
    fields = [
        "TOTALSIZE", "MAGICCODE", "BODYCRC", "QUEUEID", "FLAG", "QUEUEOFFSET",
        "PHYSICALOFFSET", "SYSFLAG", "BORNTIMESTAMP", "BORNHOST", "born port",
        "STORETIMESTAMP", "STOREHOSTADDRESS", "store port", "RECONSUMETIMES",
        "PREPARED TRANSACTION OFFSET", "BODY length",
    ]  # fmt: skip
    for fmt in (record._V4V4.format,):
        offsets = _row_offsets(fmt, fields)
        for f in fields:
            if f in RECORD:
                assert offsets[f] == RECORD[f], (fmt, f)
        assert struct.calcsize(fmt) == RECORD["BODY"]


def test_peek_store_timestamp_reads_the_table_s_field() -> None:
    enc = record.encode(record.Message("t", b"body"))
    buf = bytearray(len(enc.data))
    record.patch_append_fields(buf, 0, enc, 7, 0, 1_700_000_000_123)
    assert record.peek_store_timestamp(buf) == 1_700_000_000_123
    assert record.peek_store_timestamp(bytes(len(buf))) is None  # zeros: no record
    assert record.peek_store_timestamp(buf[:50]) is None  # too short to hold the field
