"""minigrpo: a tiny, from-scratch, character-level sandbox for RL on language models.

Imports point one way: tokenizer -> model -> prefix_tree -> logprobs -> sampling -> rollout ->
algorithms -> CLIs.

Started as `python -m minigrpo.<cli>`, the package first installs a Ctrl-C handler that prints the
one line "interrupted" and exits with code 130, so a Ctrl-C while torch is still importing shows no
traceback; `cli.main_guard` gives Ctrl-C back to Python once the command's `main` runs. A plain
`import minigrpo` changes nothing.
"""

import os
import signal
import sys
import threading

__version__ = "0.1.0"


def _interrupted_at_startup(signum, frame):
    """SIGINT before a command's main() runs: one line, exit code 130, no traceback."""
    try:
        sys.stderr.write("\ninterrupted\n")
        sys.stderr.flush()
    finally:
        os._exit(130)  # nothing is written yet; skip an interpreter shutdown that may be mid-import


def _started_as_cli() -> bool:
    """True under `python [options] -m minigrpo[.x] ...` while the module is being located (argv[0]
    == '-m')."""
    if sys.argv[:1] != ["-m"]:
        return False
    argv = getattr(sys, "orig_argv", [])
    for i, arg in enumerate(argv[1:], 1):
        if arg.startswith("-m"):
            module = arg[2:] or (argv[i + 1] if i + 1 < len(argv) else "")
            return module == "minigrpo" or module.startswith("minigrpo.")
    return False


if _started_as_cli() and threading.current_thread() is threading.main_thread():
    signal.signal(signal.SIGINT, _interrupted_at_startup)
