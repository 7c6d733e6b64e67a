"""A child process that takes Ctrl-C as one started from a terminal does."""

from __future__ import annotations

import signal


def as_from_a_terminal() -> None:
    """A `preexec_fn`: a command started from a terminal takes SIGINT; one started by a suite run in
    the background of a non-interactive shell (`make test &`) inherits it ignored (POSIX), which
    Python and the edge rightly keep, and a test's SIGINT then did nothing: the child held on
    until the test's timeout."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
