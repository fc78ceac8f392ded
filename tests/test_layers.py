"""The package's layers, read from the source with `ast` (nothing is imported): every import of
ours, at module level or inside a function, points to its own layer or one to its left, and no
modules import each other in a circle. A module's name carried in a string is an import too
(`importlib.import_module("minigrpo.grpo")`, `__import__`, a table of the commands a runner starts):
every string constant of code that is the name of a module of ours ("minigrpo.<module>",
"toy_tasks.<module>"), and every f-string or `+` whose literal head names a package or module of
ours (f"minigrpo.rl.{name}"), keeps to the same layers. Docstrings, and prose that mentions a
module, do not count; nor does a head that names no layer (f"minigrpo.{name}": it cannot be
resolved). Strings take no part in the circles: a name is not an import until it is run.

    util  lm  objectives  exact  toy_tasks  rl  variants  tools  population  commands  bench  learn

commands are the modules directly in minigrpo/ (pretrain.py, grpo.py, ...); minigrpo/__init__.py is
the root and imports nothing of ours; nothing outside bench imports bench.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("minigrpo", "toy_tasks")
LAYERS = [
    "util",
    "lm",
    "objectives",
    "exact",
    "toy_tasks",
    "rl",
    "variants",
    "tools",
    "population",
    "commands",
    "bench",
    "learn",
]
RANK = {name: i for i, name in enumerate(LAYERS)}


def module_name(path: Path, root: Path) -> str:
    """minigrpo/lm/model.py -> 'minigrpo.lm.model'; a package's __init__.py is the package
    itself."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str) -> str | None:
    """The layer of one of our modules; 'root' for minigrpo/__init__.py; None for a module that is
    not ours."""
    parts = module.split(".")
    if parts[0] == "toy_tasks":
        return "toy_tasks"
    if parts[0] != "minigrpo":
        return None
    if len(parts) == 1:
        return "root"
    return parts[1] if parts[1] in RANK else "commands"


def read_modules(root: Path = ROOT) -> dict[str, tuple[str, str]]:
    """{module name: (file relative to root, source)} for every .py of ours."""
    found = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            found[module_name(path, root)] = (
                str(path.relative_to(root)),
                path.read_text(encoding="utf-8"),
            )
    return found


def imports(module: str, source: str, is_package: bool, known) -> list[tuple[int, str, str]]:
    """[(line, imported module of ours, the import as written)] for every import in the source, at
    any depth (functions, classes, if-blocks). `from a import b` names module a.b when a.b is one of
    ours, a otherwise; relative imports are resolved against `module` (a package's own name when
    `is_package`)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                as_name = f" as {alias.asname}" if alias.asname else ""
                found.append((node.lineno, alias.name, f"import {alias.name}{as_name}"))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")[
                    : len(module.split(".")) - node.level + (1 if is_package else 0)
                ]
                base = ".".join(anchor + ([base] if base else []))
            written = (
                f"from {'.' * node.level}{node.module or ''} import "
                f"{', '.join(a.name for a in node.names)}"
            )
            for alias in node.names:
                target = f"{base}.{alias.name}"
                found.append((node.lineno, target if target in known else base, written))
    return list(
        dict.fromkeys(
            (line, name, text) for line, name, text in found if layer_of(name) is not None
        )
    )


# a string that is a name of ours: minigrpo.<module>..., toy_tasks[.<module>...]
NAME = re.compile(r"(minigrpo(\.[A-Za-z_]\w*)+|toy_tasks(\.[A-Za-z_]\w*)*)")


def named_modules(source: str, known) -> list[tuple[int, str, str]]:
    """[(line, module of ours, the string quoted)] for every string of code in the source that
    is the name of one of our modules (NAME, the whole string; "minigrpo.lm.model.GPT" names its
    longest prefix that is a module, minigrpo.lm.model), and every f-string or `+` whose literal
    head, up to its last dot, is one of ours below the root (f"minigrpo.rl.{x}" names minigrpo.rl).
    Not a string that is a statement of its own (a docstring), nor the parts of an f-string."""
    tree, found = ast.parse(source), []
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Expr) and isinstance(node.value, (ast.Constant, ast.JoinedStr)):
            skip.update(id(n) for n in ast.walk(node.value))  # a docstring, prose
        elif isinstance(node, ast.JoinedStr):
            skip.update(id(n) for n in ast.walk(node) if n is not node)
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if NAME.fullmatch(node.value):
                parts = node.value.split(".")
                prefixes = [".".join(parts[:k]) for k in range(len(parts), 0, -1)]
                target = next((p for p in prefixes if p in known and p != "minigrpo"), node.value)
                found.append((node.lineno, target, f'"{node.value}"'))
        elif isinstance(node, (ast.JoinedStr, ast.BinOp)):
            head = _literal_head(node)
            if head is not None and NAME.fullmatch(head.rpartition(".")[0] or "-"):
                target = head.rpartition(".")[0]
                if target in known and target != "minigrpo":
                    written = ast.get_source_segment(source, node) or head
                    found.append((node.lineno, target, written))
    return sorted(set(found))


def _literal_head(node) -> str | None:
    """The literal text an f-string or a `+` of strings begins with, before anything computed."""
    if isinstance(node, ast.JoinedStr):
        first = node.values[0] if node.values else None
        return first.value if isinstance(first, ast.Constant) else None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left = node.left
        if isinstance(left, ast.Constant) and isinstance(left.value, str):
            return left.value
    return None


def import_graph(modules: dict[str, tuple[str, str]]) -> dict[str, list[tuple[int, str, str]]]:
    """{module: [(line, imported module, the import as written)]} for every import of ours (the
    package's own graph made once: three tests read it)."""
    if modules is MODULES and _GRAPH:
        return _GRAPH[0]
    graph = {
        name: imports(name, source, path.endswith("__init__.py"), modules)
        for name, (path, source) in modules.items()
    }
    if modules is MODULES:
        _GRAPH.append(graph)
    return graph


def layer_violations(modules: dict[str, tuple[str, str]]) -> list[str]:
    """One line per import, or module name in a string (named_modules), that points to a layer on
    the right of the importing file's own, or to bench from outside bench, or to a module of ours
    that does not exist."""
    bad = []
    for name, edges in import_graph(modules).items():
        edges = edges + named_modules(modules[name][1], modules)
        path, mine = modules[name][0], layer_of(name)
        for line, target, text in edges:
            theirs = layer_of(target)
            if target not in modules:
                bad.append(f"{path}:{line}: `{text}` names {target}, which is not a module of ours")
            elif theirs == "root":
                # the package root: a docstring and the Ctrl-C handler, importable from anywhere
                continue
            elif mine == "root":
                bad.append(f"{path}:{line}: `{text}`: the package root imports nothing of ours")
            elif theirs == "bench" and mine != "bench":
                bad.append(
                    f"{path}:{line}: `{text}`: nothing outside bench imports bench ({name} is "
                    f"{mine})"
                )
            elif RANK[theirs] > RANK[mine]:
                bad.append(
                    f"{path}:{line}: `{text}`: {name} is in layer {mine}, which may import only "
                    "from "
                    f"{', '.join(LAYERS[: RANK[mine] + 1])}; {target} is in layer {theirs}"
                )
    return bad


def import_cycles(modules: dict[str, tuple[str, str]]) -> list[list[str]]:
    """Every strongly connected group of modules (two or more, or one importing itself), each as one
    circle a -> b -> ... -> a through the group; module-level and function-level imports alike."""
    graph = {
        m: sorted({t for _, t, _ in edges if t in modules})
        for m, edges in import_graph(modules).items()
    }
    index, low, stack, on_stack, groups, counter = {}, {}, [], set(), [], [0]

    def visit(v):  # Tarjan's algorithm
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1 or v in graph[v]:
                groups.append(group)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [circle(graph, set(group)) for group in groups]


def circle(graph: dict[str, list[str]], group: set[str]) -> list[str]:
    """One circle a -> ... -> a inside a strongly connected group (breadth-first back to the
    start)."""
    start = min(group)
    came_from, frontier = {start: None}, [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in graph[v]:
                if w == start:
                    path = [v]
                    while came_from[path[-1]] is not None:
                        path.append(came_from[path[-1]])
                    return [start] + path[::-1][1:] + [start] if v != start else [start, start]
                if w in group and w not in came_from:
                    came_from[w] = v
                    nxt.append(w)
        frontier = nxt
    return sorted(group)


# --- the package itself ---------------------------------------------------------------------------

MODULES = read_modules()
_GRAPH: list = []  # import_graph(MODULES), once


def test_the_checker_sees_the_whole_package():
    assert {
        "minigrpo.lm.model",
        "minigrpo.grpo",
        "minigrpo.bench.suite",
        "minigrpo.learn.grade",
        "toy_tasks.food",
        "minigrpo.util.cli",
    } <= set(MODULES)
    # a checker that sees no import
    assert sum(len(edges) for edges in import_graph(MODULES).values()) > 100
    # would pass anything
    assert layer_of("minigrpo.grpo") == "commands" and layer_of("minigrpo.lm.model") == "lm"
    assert layer_of("toy_tasks") == "toy_tasks" and layer_of("torch") is None


def test_every_import_points_to_its_own_layer_or_one_to_its_left():
    bad = layer_violations(MODULES)
    assert not bad, "imports against the layers " + " < ".join(LAYERS) + ":\n" + "\n".join(bad)


def test_no_modules_import_each_other_in_a_circle():
    cycles = import_cycles(MODULES)
    assert not cycles, "import circles:\n" + "\n".join(" -> ".join(c) for c in cycles)


# --- the checker can fail -------------------------------------------------------------------------


def fake(**sources: str) -> dict[str, tuple[str, str]]:
    """Modules from sources: fake(minigrpo__lm__model='...') is minigrpo/lm/model.py; a name ending
    in __init is a package."""
    out = {}
    for key, source in sources.items():
        parts = key.split("__")
        out[".".join(parts[:-1] if parts[-1] == "init" else parts)] = (fake_path(key), source)
    return out


def fake_path(key: str) -> str:
    """'minigrpo__lm__model' -> 'minigrpo/lm/model.py'; 'minigrpo__init' ->
    'minigrpo/__init__.py'."""
    parts = key.split("__")
    return "/".join(parts[:-1] + ["__init__" if parts[-1] == "init" else parts[-1]]) + ".py"


BASE = dict(
    minigrpo__init="",
    minigrpo__lm__init="",
    minigrpo__lm__model="",
    minigrpo__objectives__init="",
    minigrpo__objectives__kl="",
    minigrpo__grpo="",
    minigrpo__bench__init="",
    minigrpo__bench__common="",
    minigrpo__rl__init="",
    minigrpo__rl__loop="",
    toy_tasks__init="",
    toy_tasks__food="",
)


@pytest.mark.parametrize(
    "importer, source, names",
    [
        (
            "minigrpo__lm__model",
            "import torch\nfrom minigrpo.rl.loop import run\n",
            "minigrpo.rl.loop",
        ),
        # function level
        ("minigrpo__objectives__kl", "def f():\n    from minigrpo import grpo\n", "minigrpo.grpo"),
        ("toy_tasks__food", "import minigrpo.grpo as g\n", "minigrpo.grpo"),
        ("toy_tasks__food", "from minigrpo.rl import loop\n", "minigrpo.rl.loop"),
        (
            "minigrpo__grpo",
            "from minigrpo.bench.common import med\n",
            "nothing outside bench imports bench",
        ),
        ("minigrpo__objectives__kl", "from ..grpo import x\n", "minigrpo.grpo"),  # relative
        (
            "minigrpo__init",
            "from minigrpo.lm import model\n",
            "the package root imports nothing of ours",
        ),
        ("minigrpo__grpo", "from minigrpo.bench_rl import med\n", "not a module of ours"),
    ],
)
def test_a_forbidden_import_is_reported_naming_the_file_and_the_import(importer, source, names):
    modules = fake(**{**BASE, importer: source})
    bad = layer_violations(modules)
    assert len(bad) == 1, bad
    line = source.strip().splitlines()[-1].strip()
    assert (
        bad[0].startswith(fake_path(importer) + ":") and names in bad[0] and f"`{line}`" in bad[0]
    ), bad


def test_allowed_imports_are_not_reported():
    modules = fake(
        **{
            **BASE,
            "minigrpo__grpo": "from minigrpo.rl.loop import run\nfrom toy_tasks import food\n"
            "from minigrpo import _x\nimport os\n",
            "minigrpo__bench__common": "from minigrpo import grpo\nfrom minigrpo.bench import "
            "common\n",
            "toy_tasks__food": "from minigrpo.lm.model import GPT\nfrom toy_tasks import x\n",
        }
    )
    assert layer_violations(modules) == []


def test_a_circle_is_reported_even_inside_one_package_and_through_a_function_level_import():
    modules = fake(
        **{
            **BASE,
            "minigrpo__rl__loop": "from minigrpo.lm import model\n",
            "minigrpo__lm__model": "def f():\n    import minigrpo.rl.loop\n",
        }
    )
    assert import_cycles(modules) == [
        ["minigrpo.lm.model", "minigrpo.rl.loop", "minigrpo.lm.model"]
    ]
    same = fake(
        **{
            **BASE,
            "toy_tasks__food": "from toy_tasks import x\n",
            "toy_tasks__init": "def get():\n    from toy_tasks.food import y\n",
        }
    )
    assert import_cycles(same) == [["toy_tasks", "toy_tasks.food", "toy_tasks"]]
    assert import_cycles(fake(**BASE)) == []
    assert import_cycles(fake(**{**BASE, "minigrpo__grpo": "from . import grpo\n"})) == [
        ["minigrpo.grpo"] * 2
    ]


def plant(root: Path, files: dict[str, str]) -> dict[str, tuple[str, str]]:
    """The package's layout in `root`, these files in it (the package roots and the `__init__.py`
    of every folder besides, empty) -> read_modules(root)."""
    for rel in list(files):
        for parent in Path(rel).parents:
            if parent.parts:
                files.setdefault(str(parent / "__init__.py"), "")
    for rel, text in {"toy_tasks/__init__.py": "", **files}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return read_modules(root)


def test_a_real_file_with_a_bad_import_is_reported(tmp_path):
    modules = plant(
        tmp_path,
        {
            "minigrpo/grpo.py": "",
            "minigrpo/lm/model.py": "def build():\n    from minigrpo import grpo\n",
        },
    )
    bad = layer_violations(modules)
    assert len(bad) == 1 and bad[0].startswith(
        "minigrpo/lm/model.py:2: `from minigrpo import grpo`"
    ), bad


def test_a_real_file_that_imports_a_command_by_its_name_is_reported(tmp_path):
    """tools/pool.py as it was: a runner in the tools layer that ran a command line's
    `python -m minigrpo.grpo` by importing the module it names."""
    modules = plant(
        tmp_path,
        {
            "minigrpo/grpo.py": "def main(argv):\n    pass\n",
            "minigrpo/tools/pool.py": "import importlib\n\n\ndef run(argv):\n"
            '    return importlib.import_module("minigrpo.grpo").main(argv)\n',
        },
    )
    bad = layer_violations(modules)
    assert len(bad) == 1 and bad[0].startswith('minigrpo/tools/pool.py:5: `"minigrpo.grpo"`: '), bad
    assert "minigrpo.grpo is in layer commands" in bad[0], bad


@pytest.mark.parametrize(
    "importer, source, names",
    [
        (
            "minigrpo__rl__loop",
            'import importlib\ndef f():\n    importlib.import_module("minigrpo.grpo")\n',
            "minigrpo.grpo is in layer commands",
        ),
        ("minigrpo__lm__model", 'def f():\n    __import__("minigrpo.rl.loop")\n', "layer rl"),
        # a table of what a runner starts
        ("minigrpo__rl__loop", 'RUNS = {"grpo": ("minigrpo.grpo", [])}\n', "layer commands"),
        ("minigrpo__lm__model", 'TASK = "toy_tasks.food"\n', "toy_tasks.food is in layer"),
        # a function's path: its module
        ("minigrpo__lm__model", 'LOSS = "minigrpo.objectives.kl.k3"\n', "objectives.kl is in"),
        (
            "minigrpo__grpo",
            'def f(x):\n    return f"minigrpo.bench.{x}"\n',
            "nothing outside bench imports bench",
        ),
        ("minigrpo__lm__model", 'def f(x):\n    return "minigrpo.rl." + x\n', "layer rl"),
        ("minigrpo__grpo", 'NAME = "minigrpo.bench_rl"\n', "not a module of ours"),
    ],
)
def test_a_module_name_in_a_string_that_points_up_is_reported(importer, source, names):
    bad = layer_violations(fake(**{**BASE, importer: source}))
    line = len(source.strip().splitlines())
    assert (
        len(bad) == 1 and bad[0].startswith(f"{fake_path(importer)}:{line}: `") and names in bad[0]
    ), bad


def test_prose_docstrings_and_names_within_the_layers_are_not_reported():
    modules = fake(
        **{
            **BASE,
            "minigrpo__lm__model": '"""Used by minigrpo.grpo, with "minigrpo.rl.loop"."""\n'
            'def f(x):\n    """Called by minigrpo.grpo."""\n    "minigrpo.grpo"\n'
            '    print("run `python -m minigrpo.grpo` first")\n'
            '    return (f"minigrpo.{x}", "minigrpo." + x, f"{x}.minigrpo.grpo",\n'
            '        f"minigrpo.grpo {x}")\n',
            "minigrpo__grpo": 'import importlib\nRUNS = ("minigrpo.rl.loop", "toy_tasks.food")\n'
            'importlib.import_module("minigrpo.lm.model")\nROOT = "minigrpo"\n',
            "minigrpo__bench__common": 'RUN = ["minigrpo.grpo", "minigrpo.bench.common"]\n',
            "toy_tasks__init": 'TASKS = {"food": "toy_tasks.food"}\n',
        }
    )
    assert layer_violations(modules) == []
    # nor do they make circles: a name is not an import until it is run
    assert import_cycles(modules) == []


def test_every_module_is_under_400_lines_of_at_most_100_characters():
    """The house's size rules (one concept per file, read top to bottom; lines as ruff formats them,
    pyproject.toml): a module that grows past them is split by concept. The tests keep the
    100-character lines too, but a test file may be longer."""
    long_files, long_lines = [], []
    modules = [path for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))]
    for path in modules + sorted((ROOT / "tests").glob("*.py")):
        lines = path.read_text(encoding="utf-8").splitlines()
        name = path.relative_to(ROOT)
        if len(lines) >= 400 and name.parts[0] in PACKAGES:
            long_files.append(f"{name}: {len(lines)} lines")
        long_lines += [
            f"{name}:{i}: {len(line)} characters"
            for i, line in enumerate(lines, 1)
            if len(line) > 100
        ]
    assert len(MODULES) > 100 and not long_files and not long_lines, "\n".join(
        long_files + long_lines
    )
