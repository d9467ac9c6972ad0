"""How the commands that wait (`tail`, `status --watch`, `demo`, `make run`'s demo) stop.

SIGINT (Ctrl-C) and SIGTERM (`kill`, a service manager) raise `KeyboardInterrupt` in the
main thread while `stop_signals()` is entered, whatever disposition the process
inherited. A job started with `&` from a script inherits SIGINT *ignored* (POSIX), and
Python then installs no handler of its own: without this, `mqstore tail` run from
`nohup make test &` would never stop on SIGINT, and SIGTERM would kill it without the
final offset commit. `mqstore start` is the supervisor's, which installs its own
handlers first thing (`workers.base.install_signal_flags`).

On leaving, the dispositions from before are back (an inherited SIG_IGN included), so a
second signal during the command's clean-up is what the caller chose.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Callable, Iterator
from types import FrameType

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _interrupt(_sig: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt


@contextlib.contextmanager
def _handled(
    handler: Callable[[int, FrameType | None], None] | signal.Handlers, signals: tuple[int, ...]
) -> Iterator[None]:
    old = {sig: signal.signal(sig, handler) for sig in signals}
    try:
        yield
    finally:
        for sig, before in old.items():
            signal.signal(sig, before)


def stop_signals(*also: signal.Signals) -> contextlib.AbstractContextManager[None]:
    """SIGINT, SIGTERM (and `also`, e.g. SIGHUP) raise KeyboardInterrupt inside. Main
    thread only."""
    return _handled(_interrupt, (*STOP_SIGNALS, *also))


def ignored_stop_signals(*also: signal.Signals) -> contextlib.AbstractContextManager[None]:
    """SIGINT, SIGTERM (and `also`) ignored inside: a second Ctrl-C must not cut a
    clean-up that has begun (stopping the store it started). Main thread only."""
    return _handled(signal.SIG_IGN, (*STOP_SIGNALS, *also))


@contextlib.contextmanager
def held_stop_signals(*also: signal.Signals) -> Iterator[None]:
    """SIGINT, SIGTERM (and `also`) held inside: one that arrives there raises
    KeyboardInterrupt when the block ends, not in the middle of it (a tail's print and the
    ack of what it printed). Main thread only."""
    got: list[int] = []
    with _handled(lambda sig, _frame: got.append(sig), (*STOP_SIGNALS, *also)):
        yield
    if got:
        raise KeyboardInterrupt
