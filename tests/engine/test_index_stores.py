"""A store into a visible index-file field is one store of the whole field and a lookup
loads each field it trusts whole, slot head before count: a lookup in another process
never misses a key already indexed while the dispatcher writes (`struct.pack_into`
clears a field before it writes it, `unpack_from(">i")` loads it byte by byte, and a
count read before the slot head can be passed by two puts: each made a lookup see an
indexed key's slot as empty)."""

from __future__ import annotations

import ast
import textwrap
from contextlib import closing
from pathlib import Path

import pytest

from mqstore.engine import indexfile
from mqstore.engine.indexfile import IndexFile, key_hash
from tests.runtime.harness import racing_writer

KEY = "T#k"
SLOTS = 1  # every key collides into one slot: its head moves at every put
ENTRIES = 600_001

WRITER = textwrap.dedent(
    """
    import sys
    from array import array
    from mqstore.engine import indexfile as ix
    path, how, batches = sys.argv[1], sys.argv[2], int(sys.argv[3])
    f = ix.IndexFile.open(path, ix_slots := int(sys.argv[4]), int(sys.argv[5]), read_only=False)
    n = 64  # keys per batch: the key under watch, then another key of its slot, ...
    hashes = array("i", [ix.key_hash("T#k") if i % 2 == 0 else ix.key_hash(f"T#o{i}")
                         for i in range(n)])
    first = array("i", range(n + 1))
    ts = array("q", [1_700_000_000_000] * n)
    sys.stdout.write("ready\\n")
    sys.stdout.flush()
    for b in range(batches):
        pos = array("q", range(b * n + 1, (b + 1) * n + 1))
        batch = ix.KeyBatch(first, hashes, pos, ts, 0, 0, n)
        if how == "c":
            assert f.put_hashes(batch, 0) == n  # the dispatcher's C put
        else:
            assert ix.put_hashes(f.mm, ix_slots, f.index_num, *batch, 0) == n  # its twin
    f.close()
    """
)


@pytest.mark.parametrize("how", ["c", "python"])
def test_a_lookup_in_another_process_never_loses_an_indexed_key(tmp_path: Path, how: str) -> None:
    """A writer process puts a watched key and keys of the same slot in turns, in batches;
    this process looks the watched key up (newest first, one result) and reads the
    count while it runs. Every lookup finds the key at an offset at least the last one
    found, and the count never goes back."""
    f = IndexFile.create(tmp_path, SLOTS, ENTRIES, now_ms_value=1_700_000_000_000)
    f.put_key(KEY, 0, 1_700_000_000_000)
    path = f.path
    f.close()
    batches = (ENTRIES - 2) // 64
    last_phy = last_count = 0
    bad: list[str] = []
    reads = moving = 0
    r = IndexFile.open(path, SLOTS, ENTRIES, read_only=True)
    args = (path, how, str(batches), str(SLOTS), str(ENTRIES))
    with closing(r), racing_writer(WRITER, *args, timeout_s=300) as proc:
        while proc.poll() is None and len(bad) < 10:
            for _ in range(200):
                got = r.select_phy_offsets(KEY, 1, 0, 2**62)
                count = r.index_count
                if not got or got[0] < last_phy:
                    bad.append(f"lookup {got} after {last_phy}")
                elif count < last_count:
                    bad.append(f"count {count} after {last_count}")
                else:
                    moving += got[0] > 0 and count < ENTRIES - 64
                    last_phy, last_count = got[0], count
                reads += 1
    assert bad == [], f"in {reads} lookups: {bad}"
    # The lookups overlapped the writes (else this test could not have failed).
    assert moving > 1000, (moving, reads)
    assert key_hash(KEY) % SLOTS == 0


def _calls(attr: str) -> list[tuple[str, str]]:
    """(function, receiver) of every `<receiver>.<attr>(...)` call in engine/indexfile.py."""
    out: list[tuple[str, str]] = []
    for fn in ast.walk(ast.parse(Path(indexfile.__file__).read_text())):
        if isinstance(fn, ast.FunctionDef):
            for node in ast.walk(fn):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and node.func.attr == attr
                ):
                    out.append((fn.name, ast.unparse(node.func.value)))
    return out


def test_no_pack_into_a_visible_field_no_bytewise_load_of_one() -> None:
    """`pack_into` only for a new entry (no lookup reaches it before its slot's head,
    stored after it); a lookup's `unpack_from` only of entries (written once before they
    are reachable): slot heads and header fields are stored and loaded whole."""
    assert _calls("pack_into") == [("_put_hash", "_ENTRY")]
    lookups = {"select_phy_offsets", "entries", "__get__"}
    assert {r for fn, r in _calls("unpack_from") if fn in lookups} == {"_ENTRY"}
