"""`mqstore status --watch` fits its terminal: in 24 rows the workers are never lost.

Before, the summary table alone was taller than a 24-row terminal, so rich's live view
cut it to "…" and the workers table never showed. Now the tables condense (no titles or
frames), then leave out the summary's last rows, saying how many; the workers stay."""

from __future__ import annotations

import fcntl
import io
import os
import select
import signal
import struct
import subprocess
import sys
import termios
import time

from rich.console import Console

from mqstore.workers.commands.status import render
from tests.runtime.harness import REPO, Store, sigint_ignored


def _text(renderable: object, width: int) -> list[str]:
    console = Console(width=width, file=io.StringIO(), color_system=None)
    with console.capture() as cap:
        console.print(renderable)
    return cap.get().splitlines()


def test_the_tables_fit_the_terminal_and_keep_every_worker(store: Store) -> None:
    doc = store.status()
    names = [w["name"] for w in doc["workers"]]
    assert len(_text(render(doc), 80)) > 24  # what a 24-row terminal could not show
    for height, width in ((24, 80), (20, 100), (40, 80)):
        lines = _text(render(doc, height=height, width=width), width)
        assert len(lines) <= height, lines
        shown = "\n".join(lines)
        assert all(f" {n} " in shown or shown.startswith(n) for n in names), shown
    tall = "\n".join(_text(render(doc, height=200, width=80), 80))
    assert "more" not in tall and "flush lag" in tall  # room for all: nothing left out
    short = "\n".join(_text(render(doc, height=24, width=80), 80))
    assert "more" in short and "a taller terminal shows them" in short


def test_watch_in_a_24_row_pseudo_terminal_shows_the_workers(store: Store) -> None:
    """The real command on a pseudo-terminal of 24 rows and 80 columns (TIOCSWINSZ)."""
    names = [w["name"] for w in store.status()["workers"]]
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    env = {**os.environ, "PYTHONPATH": str(REPO), "TERM": "xterm"}
    env.pop("COLUMNS", None)
    env.pop("LINES", None)
    p = subprocess.Popen(
        sigint_ignored([sys.executable, "-m", "mqstore", "status", str(store.path), "--watch"]),
        stdin=slave, stdout=slave, stderr=slave, cwd=str(REPO), env=env,
    )  # fmt: skip
    os.close(slave)
    seen = b""
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not all(n.encode() in seen for n in names):
            ready, _, _ = select.select([master], [], [], 1.0)
            if ready:
                try:
                    seen += os.read(master, 65536)
                except OSError:  # the command exited: its side of the terminal is gone
                    break
    finally:
        p.send_signal(signal.SIGINT)
        try:
            p.wait(60)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
            os.close(master)
    text = seen.decode(errors="replace")
    assert all(n in text for n in names), text[-3000:]
    assert p.returncode == 0
