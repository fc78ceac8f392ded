"""The learner's workspace: stubs written from the library's own functions, and the learner's
functions plugged into a running process in place of the library's.

    <workspace>/advantages.py   group_advantages, rloo_advantages, gae as the learner wrote them
    <workspace>/losses.py       clipped_surrogate, aggregate ...

A stub is the library function's signature and docstring with `raise NotImplementedError` as its
body, preceded by the imports its exercise offers, each saying what it is for (path.py); the
reference (the library's own body, pasted in) adds what else that body uses. `read` tells a stub
from a written function without running the file; `status` runs it. `install` replaces the library's
function by the learner's in every loaded minigrpo module and in the module-level tables that hold
it (variants.kl.KL_ESTIMATORS, ...): in memory, in this process only. No file under minigrpo/ is
ever written, and each workspace loads under its own module names, so two learners' workspaces never
meet.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import importlib
import importlib.util
import inspect
import shlex
import sys
import textwrap
import types
from pathlib import Path

from minigrpo.learn.child import RanPastLimit, time_limit
from minigrpo.learn.path import PATH, Exercise

DEFAULT_DIR = "runs/learn"
LIBRARY_MODULES = ("minigrpo.grpo", "minigrpo.ppo")  # with what they import: everything a run uses


class LearnerError(Exception):
    """The learner's file cannot be used as it is (a syntax error, a failing import, a missing
    function)."""


def command(words: str, folder=DEFAULT_DIR) -> str:
    """The command line `python -m minigrpo.learn <words>`, with `--dir <folder>` unless it is the
    default."""
    where = "" if Path(folder) == Path(DEFAULT_DIR) else f" --dir {shlex.quote(str(folder))}"
    return f"python -m minigrpo.learn {words}{where}"


def library_function(ex: Exercise):
    return getattr(importlib.import_module(f"minigrpo.{ex.module}"), ex.name)


def _function_node(source: str, name: str) -> ast.FunctionDef | None:
    """The last top-level definition of `name` in source (the one Python keeps), None if there is
    none."""
    found = None
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            found = node
    return found


def _offered(ex: Exercise) -> set[str]:
    return {
        (alias.asname or alias.name).split(".")[0]
        for line, _ in ex.imports
        for alias in ast.parse(line).body[0].names
    }


def _library_imports(ex: Exercise) -> list[str]:
    """Import lines for the module-level names the library's body of ex uses that its stub does not
    offer: what the library's own body, pasted in as a learner's (reference_source), needs beyond
    them."""
    module = importlib.import_module(f"minigrpo.{ex.module}")
    node = _function_node(textwrap.dedent(inspect.getsource(library_function(ex))), ex.name)
    used = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} - {ex.name} - _offered(ex)
    lines, names = [], []
    for name in sorted(used):
        value = vars(module).get(name)
        if isinstance(value, types.ModuleType):
            lines.append(
                f"import {value.__name__}" + ("" if value.__name__ == name else f" as {name}")
            )
        elif value is not None:
            names.append(name)
    if names:
        lines.append(f"from minigrpo.{ex.module} import {', '.join(names)}")
    return lines


def stub_source(
    ex: Exercise, body: str | None = None, folder=DEFAULT_DIR, extra_imports: tuple[str, ...] = ()
) -> str:
    """The learner's starting point: the imports ex offers (each saying what it is for), then the
    signature and docstring of the library's function with `body` (default: raise
    NotImplementedError, naming the hint command for `folder`) in place of its code."""
    source = textwrap.dedent(inspect.getsource(library_function(ex)))
    node = _function_node(source, ex.name)
    lines = source.splitlines()
    doc_end = node.body[0].end_lineno if ast.get_docstring(node) else node.body[0].lineno - 1
    message = f"exercise {ex.number}: write {ex.name} ({command('hint %d' % ex.number, folder)})"
    body = body or f"raise NotImplementedError({message!r})"
    imports = [f"{line}  # {why}" for line, why in ex.imports] + list(extra_imports)
    return (
        "\n".join(
            imports + ["", ""] + lines[:doc_end] + ["    " + line for line in body.splitlines()]
        )
        + "\n"
    )


def reference_source(ex: Exercise) -> str:
    """The library's own function with the imports it needs: what a perfect learner would write."""
    source = textwrap.dedent(inspect.getsource(library_function(ex)))
    body = source.splitlines()[_function_node(source, ex.name).body[0].end_lineno :]
    return stub_source(
        ex, textwrap.dedent("\n".join(body)), extra_imports=tuple(_library_imports(ex))
    )


def learner_file(ex: Exercise, folder) -> Path:
    return Path(folder) / f"{ex.file_stem}.py"


def write_stub(ex: Exercise, folder, source: str | None = None) -> tuple[Path, bool]:
    """Append ex's stub (or `source`) to <folder>/<module>.py unless the function is there already.
    -> (the file, whether it was written)."""
    path = learner_file(ex, folder)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = (
        path.read_text()
        if path.exists()
        else (
            f'"""Your minigrpo.{ex.module}: the functions of the path you wrote (python -m '
            'minigrpo.learn)."""\n\n'
            "from __future__ import annotations\n"
        )
    )
    if f"def {ex.name}(" in text:
        return path, False
    path.write_text(text.rstrip("\n") + "\n\n\n" + (source or stub_source(ex, folder=folder)))
    return path, True


def _module_name(folder, module: str) -> str:
    key = hashlib.sha1(str(Path(folder).resolve()).encode()).hexdigest()[:10]
    return f"minigrpo_learner_{key}.{module}"


LOAD_LIMIT_S = 20.0  # a learner's file loads in well under a second; past this, its top level loops
# module name -> (the text that failed to load, its error line)
_FAILED: dict[str, tuple[str, str]] = {}


def load_module(folder, module: str) -> types.ModuleType | None:
    """The learner's <folder>/<module>.py as a module of its own (loaded again when the file
    changed); None if absent."""
    path = Path(folder) / f"{module}.py"
    if not path.exists():
        return None
    name, text = _module_name(folder, module), path.read_text()
    if name in sys.modules and getattr(sys.modules[name], "__learner_text__", None) == text:
        return sys.modules[name]  # loaded already, and the file has not changed since
    # failed already, unchanged: not run again (a loop costs its limit)
    if _FAILED.get(name, (None,))[0] == text:
        raise LearnerError(_FAILED[name][1])
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    try:
        with time_limit(
            LOAD_LIMIT_S,
            f"{path} ran past {LOAD_LIMIT_S:g} s while loading: does a loop at its top level never "
            "end? (code that runs on import goes under `if __name__ == '__main__':`)",
        ):
            spec.loader.exec_module(mod)
    # a learner's file: any error, a sys.exit too, is theirs
    except (Exception, SystemExit, RanPastLimit) as e:
        _FAILED[name] = (
            text,
            str(e) if isinstance(e, RanPastLimit) else f"{path}: {type(e).__name__}: {e}",
        )
        raise LearnerError(_FAILED[name][1]) from None  # in one line
    mod.__learner_text__ = text
    sys.modules[name] = mod
    return mod


def _stub_node(node: ast.FunctionDef) -> bool:
    body = node.body[1:] if ast.get_docstring(node) else node.body
    return (
        len(body) == 1
        and isinstance(body[0], ast.Raise)
        and "NotImplementedError" in ast.unparse(body[0])
    )


def is_stub(fn) -> bool:
    """True while fn's body is still only `raise NotImplementedError(...)` (after its docstring)."""
    return _stub_node(_function_node(textwrap.dedent(inspect.getsource(fn)), fn.__name__))


def learner_function(ex: Exercise, folder):
    """The learner's function for ex, None when it is absent or still a stub."""
    mod = load_module(folder, ex.file_stem)
    fn = getattr(mod, ex.name, None) if mod is not None else None
    return None if fn is None or is_stub(fn) else fn


def read(ex: Exercise, folder) -> tuple[str, str]:
    """Without running the learner's file: ('not started' | 'stub' | 'written' | 'does not load',
    the compiler's error for the last). A file that compiles may still fail when it runs (an import
    that is not there): `status` runs it."""
    path = learner_file(ex, folder)
    text = path.read_text() if path.exists() else ""
    if f"def {ex.name}(" not in text:
        return "not started", ""
    try:
        # a SyntaxError, a misplaced __future__ import
        compile(text, str(path), "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as e:
        return "does not load", f"{path}: {type(e).__name__}: {e}"
    node = _function_node(text, ex.name)
    if node is None:  # nested, or a method: `def name(` is there, but not at the top level
        return "not started", ""
    return ("stub" if _stub_node(node) else "written"), ""


def function_source(ex: Exercise, folder) -> str:
    """The text of the learner's function (its last top-level definition), '' when there is none."""
    path = learner_file(ex, folder)
    text = path.read_text() if path.exists() else ""
    try:
        node = _function_node(text, ex.name)
    except SyntaxError:
        return ""
    return (ast.get_source_segment(text, node) or "") if node is not None else ""


def status(ex: Exercise, folder) -> str:
    """'not started', 'stub', 'does not load' or 'written' (graded status lives in grade.py)."""
    path = learner_file(ex, folder)
    if not path.exists() or f"def {ex.name}(" not in path.read_text():
        return "not started"
    try:
        return "written" if learner_function(ex, folder) is not None else "stub"
    except LearnerError:
        return "does not load"


def replace_everywhere(old, new) -> int:
    """Put `new` wherever a loaded minigrpo or toy_tasks module holds `old`: as a module attribute,
    as a value of a dict at its top level, or as a field of a dataclass entry of such a dict (a
    variant table's entry)."""
    count = 0
    for name, mod in list(sys.modules.items()):
        if not (name.startswith(("minigrpo.", "toy_tasks")) or name == "minigrpo"):
            continue
        for attr, value in list(vars(mod).items()):
            if value is old:
                setattr(mod, attr, new)
                count += 1
            elif isinstance(value, dict):
                for key, entry in list(value.items()):
                    if entry is old:
                        value[key] = new
                        count += 1
                    elif dataclasses.is_dataclass(entry) and not isinstance(entry, type):
                        held = {
                            f.name: new
                            for f in dataclasses.fields(entry)
                            if getattr(entry, f.name) is old
                        }
                        if held:
                            value[key] = dataclasses.replace(entry, **held)
                            count += len(held)
    return count


def install(folder, only: set[str] | None = None) -> list[Exercise]:
    """Plug the learner's written functions (all, or those named in `only`) into this process, in
    path order, so a later piece (the capstone) picks up the earlier ones. -> the exercises plugged
    in."""
    for module in LIBRARY_MODULES:
        importlib.import_module(module)
    plugged = []
    for ex in PATH:
        if only is not None and ex.name not in only:
            continue
        # a stub, or a file that does not load, leaves the library's
        if status(ex, folder) == "written":
            replace_everywhere(library_function(ex), learner_function(ex, folder))
            plugged.append(ex)
    return plugged
