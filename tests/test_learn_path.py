"""minigrpo.learn as a learner walks it: what each stub and first hint teach (every graded property,
no part of the answer imported), where the path sends the learner next, and the docs' table of tests
per exercise."""

import ast
import json
import re
from pathlib import Path

import pytest
from test_learn import plant

from minigrpo.learn import grade, workspace
from minigrpo.learn.__main__ import main
from minigrpo.learn.path import PATH, find


def plain(text: str) -> str:
    return " ".join(text.lower().split())


def stub_docstring(ex) -> str:
    (node,) = [
        n for n in ast.parse(workspace.stub_source(ex)).body if isinstance(n, ast.FunctionDef)
    ]
    return ast.get_docstring(node) or ""


@pytest.mark.parametrize("ex", PATH, ids=[e.name for e in PATH])
def test_every_graded_property_is_stated_in_the_stub_docstring_or_the_first_hint(ex):
    graded = {t.split("::")[-1] for t in grade.test_ids(ex, grade.repo_root())}
    said = plain(stub_docstring(ex) + " " + ex.hints[0])
    assert getattr(ex, "graded", ()), (
        f"exercise {ex.number} {ex.name} declares none of the properties it grades"
    )
    covered = set()
    for req in ex.graded:
        parts = req.tests.split()
        assert len(req.words.strip()) >= 4 and parts, (
            f"{ex.name}: {req} states nothing or grades nothing"
        )
        for part in parts:
            hits = {t for t in graded if part in t}
            assert hits, f"{ex.name}: {part!r} names none of its graded tests {sorted(graded)}"
            covered |= hits
        assert plain(req.words) in said, (
            f"exercise {ex.number} {ex.name}: {req.words!r} (graded by {req.tests}) "
            "is stated neither in the stub's docstring nor in its first hint"
        )
    assert covered == graded, (
        f"exercise {ex.number} {ex.name} grades, unstated: {sorted(graded - covered)}"
    )


ANSWERS = {
    "group_advantages": {"_std"},
    "clipped_surrogate": {"masked_inputs", "_bounds"},
    "aggregate": {"_AGGREGATORS"},
    "grpo_loss": {"policy_loss_per_token", "reduction"},
}


@pytest.mark.parametrize("ex", PATH, ids=[e.name for e in PATH])
def test_a_stub_imports_only_what_is_not_the_exercise_each_import_saying_what_it_is_for(ex):
    stub = workspace.stub_source(ex)
    lines = stub.splitlines()
    imports = [n for n in ast.parse(stub).body if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert imports, f"{ex.name}: the stub imports nothing (torch at least)"
    names = set()
    for node in imports:
        line = lines[node.lineno - 1]
        assert len(line.partition("  # ")[2].split()) >= 2, (
            f"{ex.name}: {line!r} says in no comment what it is for"
        )
        names |= {alias.name.split(".")[-1] for alias in node.names}
    assert not {n for n in names if n.startswith("_")}, (
        f"{ex.name}'s stub imports the library's private helpers"
    )
    assert ex.name not in names and not names & ANSWERS.get(ex.name, set()), (
        f"{ex.name}'s stub hands over {names}"
    )


@pytest.mark.slow  # collects every exercise's tests in a pytest process of its own (3 s)
def test_the_docs_table_of_tests_per_exercise_is_what_check_counts():
    counts = grade.test_counts()
    want = [
        f"| {ex.number} | `{ex.name}` ({ex.file_stem}.py) | {ex.lesson} | {counts[ex.name]} |"
        for ex in PATH
    ]
    docs = (grade.repo_root() / "docs" / "learn.md").read_text()
    rows = [line for line in docs.splitlines() if re.match(r"\| \d+ \| `", line)]
    assert rows == want, "docs/learn.md's table must be, as the code counts it:\n" + "\n".join(want)


def record_passing(folder, *numbers):
    """Plant the library's own functions as the learner's and record them passing (as `check`
    would)."""
    for n in numbers:
        ex = find(str(n))
        plant(folder, ex.name, workspace.reference_source(ex))
        grade.record(ex, folder, passed=True)


def run(argv, capsys):
    """(exit code, stdout) of `python -m minigrpo.learn argv`."""
    code = 0
    try:
        main(argv)
    except SystemExit as e:
        code = e.code
    return code, capsys.readouterr().out


@pytest.mark.slow
def test_the_path_sends_the_learner_to_the_first_exercise_not_passing(tmp_path, capsys):
    d = str(tmp_path / "ws")
    say = lambda words: workspace.command(words, d)
    assert f"start with: {say('start 1')}" in run(["list", "--dir", d], capsys)[1]
    record_passing(d, 1, 2, 3)
    assert f"next: {say('start 4')}" in run(["list", "--dir", d], capsys)[1]
    run(["start", "4", "--dir", d], capsys)
    assert f"then: {say('check 4')}" in run(["list", "--dir", d], capsys)[1]
    path = workspace.learner_file(find("k1"), d)
    path.write_text(
        re.sub(
            r"    raise NotImplementedError\(.*\)\n",
            "    return ref_logp - logp\n",
            path.read_text(),
        )
    )
    code, out = run(["check", "4", "--dir", d], capsys)
    assert code == 1 and "the KL's sign" in out and say("hint 4") in out and "Next" not in out, out
    path.write_text(path.read_text().replace("return ref_logp - logp", "return logp - ref_logp"))
    code, out = run(["check", "4", "--dir", d], capsys)
    assert code == 0 and f"Next: {say('start 5')}" in out, out
    assert f"next: {say('start 5')}" in run(["list", "--dir", d], capsys)[1]
    first, second = find("4").hints[:2]
    again = run(["hint", "4", "2", "--dir", d], capsys)[1]
    assert f"hint 2 of {len(find('4').hints)} for exercise 4 k1: {second}" in again, again
    out = run(["hint", "4", "--all", "--dir", d], capsys)[1]
    assert first in out and second in out, out


@pytest.mark.slow
def test_check_all_says_next_only_for_an_exercise_not_passing(tmp_path, capsys):
    d = str(tmp_path / "ws")
    record_passing(d, 5)
    plant(d, "k1", workspace.reference_source(find("k1")))
    code, out = run(["check", "--all", "--dir", d], capsys)
    assert code == 1 and "the path: 2 of 12 passing" in out, out
    for n in re.findall(r"(?:Next|next): python -m minigrpo\.learn (?:start|check) (\d+)", out):
        assert grade.graded_status(find(n), d) != "passing", (
            f"Next points at exercise {n}, which passes: {out}"
        )
    assert f"next: {workspace.command('start 1', d)}" in out, out


@pytest.mark.slow
def test_a_file_that_does_not_load_says_so_with_its_error(tmp_path, capsys):
    d = str(tmp_path / "ws")
    run(["start", "1", "--dir", d], capsys)
    path = workspace.learner_file(find("1"), d)
    # an import before `from __future__ import annotations`
    path.write_text("import math\n" + path.read_text())
    for argv in (["check", "1"], ["check", "--all"]):
        code, out = run([*argv, "--dir", d], capsys)
        assert code == 1 and "exercise 1 group_advantages: your file does not load" in out, out
        assert (
            "from __future__ imports must occur at the beginning of the file" in out
            and "not started" not in out.split("exercise 2")[0]
        ), out
    assert re.search(r"1 +group_advantages +does not load", run(["list", "--dir", d], capsys)[1])
    written = re.sub(
        r"    raise NotImplementedError\(.*\)\n", "    return rewards\n", path.read_text()
    )
    # compiles, but imports a module that is not there
    path.write_text(
        written.replace("import math\n", "", 1).replace(
            "import torch", "import torch\nimport no_such_module_anywhere", 1
        )
    )
    code, out = run(["check", "1", "--dir", d], capsys)
    assert code == 1 and "your file does not load" in out and "no_such_module_anywhere" in out, out


def test_when_every_exercise_passes_the_path_ends_at_grpo_in_one_file(
    tmp_path, capsys, monkeypatch
):
    d = str(tmp_path / "ws")
    record_passing(d, *range(1, len(PATH) + 1))
    out = run(["list", "--dir", d], capsys)[1]
    assert (
        "start with" not in out
        and "minigrpo/grpo_one_file.py" in out
        and workspace.command("check --all", d) in out
    ), out
    init = tmp_path / "model.pt"
    init.write_text("a checkpoint")

    def trained(cmd, watch=None, **kw):  # the capstone's run, as if it had learned
        out_dir = Path(cmd[cmd.index("--out") + 1])
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "summary.json").write_text(json.dumps({"target_rate": 0.97}))
        return 0, "done\n", ""

    monkeypatch.setattr("minigrpo.learn.child.run", trained)
    assert grade.capstone(d, init=init) == (True, 0.97)
    out = capsys.readouterr().out
    assert "capstone passed" in out and "minigrpo/grpo_one_file.py" in out, out
    assert "GRPO in one file" in out and "then minigrpo/grpo.py" in out, out
