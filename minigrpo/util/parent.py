"""A child process that does not outlive its parent: the kernel's parent-death signal.

    if signal_on_parent_death(signal.SIGKILL) and os.getppid() != parent_pid:
        os._exit(1)  # the parent died before the request: no signal will come

Linux only (prctl's PR_SET_PDEATHSIG); elsewhere `signal_on_parent_death` says it could not, and the
caller falls back on noticing its parent's absence another way (a closed pipe). The signal comes
when the thread that started the child ends, and again each time a subreaper the child was handed to
ends: a handler that must act once (a Ctrl-C, whose second one means "stop at once") has to ignore
the later ones itself.
"""

from __future__ import annotations

import ctypes
import sys

PR_SET_PDEATHSIG = 1


def signal_on_parent_death(sig: int) -> bool:
    """Ask the kernel to send this process `sig` when its parent dies -> whether the request was
    made."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False
