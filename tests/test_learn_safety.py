"""minigrpo.learn with a learner's code that never returns, a check stopped from outside, a --dir
that cannot be a workspace, and the commands it prints naming the learner's --dir."""

import os
import re
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager

import pytest

from minigrpo.learn import grade, workspace
from minigrpo.learn.__main__ import main
from minigrpo.learn.path import find

LOOP = "while True:\n    pass"  # a learner's body that never returns
STUBBORN = (
    "while True:\n    try:\n        while True:\n            pass\n    except "
    "BaseException:\n        pass"
)


def plant_loop(folder, name, mark=None, loop=LOOP):
    """A learner's `name` that never returns (after touching the file `mark`, when given)."""
    body = loop if mark is None else f"import pathlib\npathlib.Path({str(mark)!r}).touch()\n{loop}"
    path, written = workspace.write_stub(
        find(name), folder, workspace.stub_source(find(name), body)
    )
    assert written and workspace.learner_function(find(name), folder) is not None
    return path


@contextmanager
def deadline(seconds):
    """Fail the test (instead of hanging it) when its block has not ended after `seconds`."""

    def expired(signum, frame):
        raise AssertionError(f"still running after {seconds} s: it never ends")

    old = signal.signal(signal.SIGUSR1, expired)
    timer = threading.Timer(seconds, os.kill, (os.getpid(), signal.SIGUSR1))
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        signal.signal(signal.SIGUSR1, old)


@pytest.mark.parametrize("loop", [LOOP, STUBBORN], ids=["loop", "loop_that_catches_the_alarm"])
@pytest.mark.slow
def test_check_of_a_function_that_loops_forever_ends_naming_the_test_and_says_what_it_waits_for(
    tmp_path, capsys, monkeypatch, loop
):
    monkeypatch.setattr("minigrpo.learn.runner.TEST_LIMIT_S", 3, raising=False)
    monkeypatch.setattr("minigrpo.learn.runner.STILL_AFTER_S", 1, raising=False)
    # the command kills what the alarm cannot stop
    monkeypatch.setattr("minigrpo.learn.runner.KILL_AFTER_S", 2, raising=False)
    plant_loop(tmp_path, "k1", loop=loop)
    with deadline(90):
        assert grade.check(find("k1"), tmp_path) is False
    out = capsys.readouterr().out
    assert re.search(
        r"test_\w+(\[[^\]]*\])? ran past 3 s: does your function loop forever\?", out
    ), out
    assert re.search(r"still checking k1: waiting for test_\w+.* \(\d+ s\)", out), out
    assert grade.graded_status(find("k1"), tmp_path) == "failing"


def children(pid: int) -> list[int]:
    """The processes whose parent is pid (from /proc/*/stat)."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if entry.isdigit() and int(fields[1]) == pid:
            found.append(int(entry))
    return found


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has ended
    except OSError:
        return False


def stop_from_outside_and_assert_no_child_survives(cmd, sig, cwd, mark):
    """Start cmd; once its child runs the learner's loop (`mark` exists), stop cmd with sig: its
    child must end."""
    parent = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    child = None
    try:
        # until the child runs the learner's loop (python start-up, torch's import)
        for _ in range(600):
            kids = children(parent.pid)
            child = kids[0] if kids else child
            if mark.exists():
                break
            assert parent.poll() is None, f"the parent ended first: {parent.returncode}"
            time.sleep(0.1)
        assert child is not None and mark.exists(), "the child never ran the learner's function"
        parent.send_signal(sig)
        parent.wait(timeout=20)
        for _ in range(50):
            if not alive(child):
                break
            time.sleep(0.1)
        assert not alive(child), f"the child {child} outlived its parent (stopped by {sig.name})"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        if child is not None and alive(child):
            os.kill(child, signal.SIGKILL)  # the orphan this test started


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize(
    "sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGKILL], ids=lambda s: s.name
)
@pytest.mark.slow
def test_a_check_stopped_from_outside_leaves_no_pytest_behind(tmp_path, sig):
    plant_loop(tmp_path, "k1", mark=tmp_path / "looping")
    cmd = [sys.executable, "-m", "minigrpo.learn", "check", "k1", "--dir", str(tmp_path)]
    stop_from_outside_and_assert_no_child_survives(
        cmd, sig, grade.repo_root(), tmp_path / "looping"
    )


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.slow
def test_a_capstone_stopped_from_outside_leaves_no_training_run_behind(tmp_path, tiny_pretrained):
    init, _, _ = tiny_pretrained
    plant_loop(tmp_path, "grpo_loss", mark=tmp_path / "looping")
    code = (
        "import sys; from minigrpo.learn import grade; grade.capstone(sys.argv[1], "
        "init=sys.argv[2])"
    )
    cmd = [sys.executable, "-c", code, str(tmp_path), str(init)]
    stop_from_outside_and_assert_no_child_survives(
        cmd, signal.SIGTERM, grade.repo_root(), tmp_path / "looping"
    )


def assert_one_line_exit_2(argv, capsys, *words):
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith("error:") and err.count("\n") == 1, (argv, err)
    for word in words:
        assert word in err, (argv, err)


def test_a_dir_that_is_a_file_or_under_a_file_is_one_line_and_exit_2(tmp_path, capsys):
    a_file = tmp_path / "notes.txt"
    a_file.write_text("not a folder\n")
    for command in (["start", "1"], ["hint", "1"], ["check", "1"], ["list"]):
        assert_one_line_exit_2([*command, "--dir", str(a_file)], capsys, str(a_file), "is a file")
        assert_one_line_exit_2(
            [*command, "--dir", str(a_file / "ws")], capsys, str(a_file / "ws"), "is a file"
        )
    assert a_file.read_text() == "not a folder\n"


def test_an_empty_dir_is_refused_not_read_as_the_current_folder(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "advantages.py").write_text("# the learner's own file\n")
    for command in (["start", "1"], ["hint", "1"], ["check", "1"], ["list"]):
        for empty in ("", " "):
            said = f"--dir {empty!r} names no folder"  # as given: ' ' is not ''
            assert_one_line_exit_2([*command, "--dir", empty], capsys, said)
    assert (tmp_path / "advantages.py").read_text() == "# the learner's own file\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["advantages.py"]


def test_a_read_only_dir_is_one_line_and_exit_2(tmp_path, capsys):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        if os.access(ro, os.W_OK):
            pytest.skip(
                "this user writes into a read-only folder (root): the two tests above cover --dir"
            )
        for d in (ro, ro / "ws"):
            assert_one_line_exit_2(["start", "1", "--dir", str(d)], capsys, str(d), "not writable")
    finally:
        ro.chmod(0o755)


def test_the_commands_printed_name_the_dir_the_learner_gave(tmp_path, capsys, monkeypatch):
    for d in (str(tmp_path / "ws"), str(tmp_path / "my ws")):
        quoted = f"'{d}'" if " " in d else d
        main(["start", "1", "--dir", d])
        out = capsys.readouterr().out
        assert f"python -m minigrpo.learn check 1 --dir {quoted}" in out, out
        assert f"python -m minigrpo.learn hint 1 --dir {quoted}" in out, out
        main(["list", "--dir", d])  # exercise 1 is a stub now: write it, then check it
        assert f"then: python -m minigrpo.learn check 1 --dir {quoted}" in capsys.readouterr().out
        assert grade.check(find("rloo_advantages"), d) is False  # not started: says how to start it
        assert f"python -m minigrpo.learn start 2 --dir {quoted}" in capsys.readouterr().out
    monkeypatch.chdir(tmp_path)  # the default workspace, runs/learn, is then under tmp_path
    main(["start", "1"])
    out = capsys.readouterr().out
    assert (tmp_path / workspace.DEFAULT_DIR / "advantages.py").exists()
    assert "python -m minigrpo.learn check 1" in out and "--dir" not in out, out


@pytest.mark.slow
def test_check_of_a_function_that_ends_its_process_names_the_test_and_os_exit(tmp_path, capsys):
    """os._exit in a learner's function ends the check's pytest before its report: the check names
    the test that was running and what ends a process, not "collection"."""
    plant_loop(tmp_path, "k1", loop="import os\nos._exit(3)")
    with deadline(120):
        assert grade.check(find("k1"), tmp_path) is False
    out = capsys.readouterr().out
    assert "exit code 3 in this test" in out and "os._exit" in out, out
    assert re.search(r"test_\w+", out) and "collection" not in out, out


@pytest.mark.slow
def test_check_of_a_function_that_calls_sys_exit_names_it_in_each_test(tmp_path, capsys):
    """sys.exit in a learner's function failed its tests as a bare "SystemExit" and ended the
    check's pytest in the mistakes' probes, which then read as "os._exit or end the process": each
    test and the probes name sys.exit with its code, and the report is whole."""
    plant_loop(tmp_path, "k1", loop="import sys\nsys.exit(7)")
    with deadline(120):
        assert grade.check(find("k1"), tmp_path) is False
    out = capsys.readouterr().out
    said = "your code called sys.exit(7): a graded function returns its result"
    assert out.count(said) >= 2 and "in the probes of the catalogued mistakes" in out, out
    assert "os._exit" not in out and "exit code" not in out and "collection" not in out, out


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.slow
def test_a_process_a_learners_code_starts_ends_with_the_check(tmp_path, capsys):
    """A process started by the learner's function (here `sleep 600`) outlived the check, its parent
    pytest gone: the check's pytest leads a process group of its own, killed when the check ends."""
    started = tmp_path / "started"
    body = (
        f"import pathlib, subprocess\nmark = pathlib.Path({str(started)!r})\n"
        "if not mark.exists():\n"
        "    mark.write_text(str(subprocess.Popen(['sleep', '600']).pid))\n"
        "return logp - ref_logp"
    )
    plant_loop(tmp_path, "k1", loop=body)
    try:
        with deadline(120):
            grade.check(find("k1"), tmp_path)
        capsys.readouterr()
        pid = int(started.read_text())
        for _ in range(50):  # SIGKILL is sent as the check ends; /proc shows it at once or soon
            if not alive(pid):
                break
            time.sleep(0.1)
        assert not alive(pid), f"the learner's process {pid} outlived the check"
    finally:
        if started.exists() and alive(int(started.read_text())):
            os.kill(int(started.read_text()), signal.SIGKILL)  # the orphan this test made
