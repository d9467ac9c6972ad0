from __future__ import annotations

from pathlib import Path

from mqstore.conf.reference import page

DOC = Path(__file__).resolve().parents[2] / "docs" / "settings.md"


def test_committed_settings_page_matches_the_settings() -> None:
    assert DOC.read_text(encoding="utf-8") == page(), (
        "docs/settings.md is stale: run `python -m mqstore.conf.reference > docs/settings.md`"
    )
