"""util/parent.py: a child that asked for the parent-death signal gets it when its parent dies."""

import os
import subprocess
import sys
import time

import pytest

from minigrpo.util.parent import signal_on_parent_death

CHILD = (
    "import signal, sys, time; from minigrpo.util.parent import signal_on_parent_death; "
    "assert signal_on_parent_death(signal.SIGTERM); print('ready', flush=True); time.sleep(60)"
)
PARENT = (
    "import subprocess, sys; c = subprocess.Popen([sys.executable, '-c', sys.argv[1]], "
    "stdout=subprocess.PIPE, "
    # then it exits
    "text=True); assert c.stdout.readline() == 'ready\\n'; print(c.pid, flush=True)"
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_child_gets_its_signal_when_its_parent_exits():
    out = subprocess.run(
        [sys.executable, "-c", PARENT, CHILD], capture_output=True, text=True, timeout=60
    )
    child = int(out.stdout.split()[-1])
    deadline = time.time() + 20
    while (
        time.time() < deadline
        and os.path.exists(f"/proc/{child}")
        and open(f"/proc/{child}/stat").read().split(") ")[1][0] != "Z"
    ):
        time.sleep(0.1)
    alive = (
        os.path.exists(f"/proc/{child}")
        and open(f"/proc/{child}/stat").read().split(") ")[1][0] != "Z"
    )
    if alive:
        os.kill(child, 9)
    assert not alive, "the child outlived its parent by 20 s"


def test_the_request_is_refused_off_linux(monkeypatch):
    monkeypatch.setattr(sys, "platform", "darwin")
    assert signal_on_parent_death(15) is False
