"""The operator docs cannot drift from the code: every RocketMQ key that is read is in
broker-conf.md with its setting, every recovery report field is explained, the index
links every page and every link resolves."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from mqstore.conf.load import RMQ_TO_FIELD
from mqstore.engine.recovery import RecoveryReport

REPO = Path(__file__).resolve().parent.parent.parent
DOCS = REPO / "docs"


def test_broker_conf_lists_every_key_that_is_read_with_its_setting() -> None:
    text = (DOCS / "broker-conf.md").read_text()
    rows = {
        m.group(1): m.group(2)
        for m in re.finditer(r"^\| `([^`]+)` \| `([^`]+)` \|$", text, flags=re.MULTILINE)
    }
    missing = sorted(k for k in RMQ_TO_FIELD if k not in rows)
    assert not missing, f"docs/broker-conf.md lacks RocketMQ keys: {missing}"
    wrong = {k: (rows[k], v) for k, v in RMQ_TO_FIELD.items() if rows[k] != v}
    assert not wrong, f"docs/broker-conf.md maps keys to the wrong setting: {wrong}"
    extra = sorted(k for k in rows if k not in RMQ_TO_FIELD)
    assert not extra, f"docs/broker-conf.md lists keys that are not read: {extra}"


def test_recovery_doc_explains_every_report_field() -> None:
    text = (DOCS / "recovery.md").read_text()
    names = [f.name for f in dataclasses.fields(RecoveryReport) if f.name != "store_dir"]
    assert [n for n in names if f"`{n}`" not in text] == []


def test_index_links_every_page_and_links_resolve() -> None:
    index = (DOCS / "README.md").read_text()
    pages = sorted(p.name for p in DOCS.glob("*.md") if p.name != "README.md")
    assert [p for p in pages if f"]({p})" not in index] == []
    for page in DOCS.glob("*.md"):
        for target in re.findall(r"\]\(([^)#]+)\)", page.read_text()):
            if "://" in target:
                continue
            assert (page.parent / target).exists(), f"{page.name} links to missing {target}"


def test_top_level_readme_links_the_docs_and_keeps_its_first_lines() -> None:
    text = (REPO / "README.md").read_text()
    assert "](docs/README.md)" in text
    first = text.splitlines()[:5]
    assert first[3].startswith("make run") and first[4].startswith("make test")


def test_pipeline_doc_lists_every_option_the_source_takes() -> None:
    from mqstore.pipeline.source import OPTIONS

    text = (DOCS / "pipeline.md").read_text()
    rows = {m.lower() for m in re.findall(r"^\| `([A-Za-z]+)` \|", text, flags=re.MULTILINE)}
    assert rows == OPTIONS - {"path"}
