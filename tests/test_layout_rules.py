"""The code layout's rules (issue 28), read from the source with `ast` (nothing is imported):

- no function outside tests/ longer than MAX_FUNCTION_LINES (def line to last line);
- the import graph of our packages has no cycle, counting imports inside functions too (a lazy import is still a
  dependency: the footprint <-> policy cycle was one);
- `ulacache` (the library) imports none of our other packages; the simulator core (sim/) never imports its studies
  (sim/studies/); only the command front-ends (ulacache_cli/) import ulacache_cli, besides `python -m hw`'s entry;
- no `==` / `!=` comparison with a system or policy name outside the classes that own that knowledge (sim/systems.py,
  ulacache/policies/): elsewhere the registries' classes are asked (footprint asks the policy, reports read the
  facts metrics.json records).
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("ulacache", "traces", "sim", "hw", "reports", "ulacache_cli")
MAX_FUNCTION_LINES = 60
# Files whose long functions are known and pending (the allow-list only shrinks):
LONG_FUNCTIONS_PENDING: set[str] = set()
# Modules outside ulacache_cli that may import it: entry points only
CLI_ENTRY_POINTS = {"hw.__main__"}  # `python -m hw` on device hosts reads ulacache_cli/hw.py's parsers
SKIP_DIRS = {"tests", "build", "dist", "out", "node_modules", "__pycache__"}
SYSTEM_NAMES = ("sglang", "hisparse", "ulacache")
POLICY_NAMES = ("pb-lru", "lru", "hisparse")
NAME_OWNERS = ("sim/systems.py", "ulacache/policies/")  # where a name may be compared with
# (file, name) comparisons left where they are, each with its reason (the allow-list only shrinks):
NAME_BRANCHES_ALLOWED: dict[tuple[str, str], str] = {
    ("traces/atomic.py", "ulacache"): "the manifest's tool name (the command), not the system",
    ("ulacache/backends/cupy_pipeline.py", "pb-lru"): "DevicePbLru mirrors one policy's state on the GPU and refuses "
                                                      "the others (GPU-only code, left as it is tested there)",
    ("reports/figures.py", "pb-lru"): "the miss-ratio figure draws pb-lru's curve first (legend order of the two "
                                      "policies the figure compares; results carry no order)",
}


def _source_files(root: Path):
    """Our .py files outside tests/: hidden folders, virtual environments and build outputs left out."""
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        parts = rel.parts[:-1]
        if any(p.startswith(".") or p in SKIP_DIRS or p.endswith(".egg-info") for p in parts):
            continue
        if parts and (root / parts[0] / "pyvenv.cfg").exists():
            continue
        yield rel


def long_functions(root: Path, limit: int = MAX_FUNCTION_LINES) -> list[tuple[str, str, int]]:
    """(file, function, lines) of every function over `limit` lines."""
    out = []
    for rel in _source_files(root):
        tree = ast.parse((root / rel).read_text(), filename=str(rel))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > limit:
                    out.append((rel.as_posix(), node.name, lines))
    return out


def _modules(root: Path, packages) -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (file, is a package's __init__)."""
    mods = {}
    for pkg in packages:
        for path in (root / pkg).rglob("*.py"):
            parts = list(path.relative_to(root).with_suffix("").parts)
            is_pkg = parts[-1] == "__init__"
            mods[".".join(parts[:-1] if is_pkg else parts)] = (path, is_pkg)
    return mods


def _imports(node: ast.AST):
    """Every import statement, inside functions too, but not under `if TYPE_CHECKING:` (never run)."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and getattr(child.test, "id", getattr(child.test, "attr", None)) == "TYPE_CHECKING":
            yield from (i for n in child.orelse for i in _imports_in(n))
        else:
            yield from _imports_in(child)


def _imports_in(node: ast.AST):
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        yield node
    else:
        yield from _imports(node)


def import_graph(root: Path, packages=PACKAGES) -> dict[str, set[str]]:
    """Module -> the modules of ours it imports (`from pkg import name` counts as pkg.name when that is a module)."""
    mods = _modules(root, packages)
    graph = {}
    for name, (path, is_pkg) in mods.items():
        deps = set()
        for node in _imports(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                base = node.module or ""
                if node.level:
                    here = name.split(".") if is_pkg else name.split(".")[:-1]
                    here = here[:len(here) - node.level + 1]
                    base = ".".join(here + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            for target in targets:
                while target and target not in mods:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    deps.add(target)
        graph[name] = deps
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, on_stack, stack, out = {}, {}, set(), [], []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def name_branches(root: Path, names=SYSTEM_NAMES + POLICY_NAMES, owners=NAME_OWNERS) -> list[tuple[str, int, str]]:
    """(file, line, name) of every `==` / `!=` comparison with one of `names` (a string literal) outside `owners`."""
    out = []
    for rel in _source_files(root):
        path = rel.as_posix()
        if any(path == o or (o.endswith("/") and path.startswith(o)) for o in owners):
            continue
        for node in ast.walk(ast.parse((root / rel).read_text(), filename=path)):
            if isinstance(node, ast.Compare) and any(isinstance(op, (ast.Eq, ast.NotEq)) for op in node.ops):
                for side in [node.left, *node.comparators]:
                    if isinstance(side, ast.Constant) and side.value in names:
                        out.append((path, node.lineno, side.value))
    return out


def _package(module: str) -> str:
    return module.split(".")[0]


def test_no_function_over_60_lines_outside_tests():
    found = [f for f in long_functions(ROOT) if f[0] not in LONG_FUNCTIONS_PENDING]
    assert not found, f"functions over {MAX_FUNCTION_LINES} lines (split them into named steps): {found}"


def test_the_pending_allow_list_is_still_needed():
    """An allow-listed file whose functions all fit must leave the list."""
    pending = {f[0] for f in long_functions(ROOT)}
    assert LONG_FUNCTIONS_PENDING <= pending, f"no longer pending: {sorted(LONG_FUNCTIONS_PENDING - pending)}"


def test_import_graph_has_no_cycle():
    graph = import_graph(ROOT)
    assert len(graph) > 50  # the packages were found
    assert not cycles(graph), f"import cycles: {cycles(graph)}"


def test_imports_flow_one_way():
    graph = import_graph(ROOT)
    library = {m: sorted(d for d in deps if _package(d) != "ulacache")
               for m, deps in graph.items() if _package(m) == "ulacache"}
    assert not {m: d for m, d in library.items() if d}, "ulacache must import none of our other packages"
    core = {m: sorted(d for d in deps if d.startswith("sim.studies"))
            for m, deps in graph.items() if _package(m) == "sim" and not m.startswith("sim.studies")}
    assert not {m: d for m, d in core.items() if d}, "the simulator core must not import sim.studies"
    cli = {m: sorted(d for d in deps if _package(d) == "ulacache_cli") for m, deps in graph.items()
           if _package(m) != "ulacache_cli" and m not in CLI_ENTRY_POINTS}
    assert not {m: d for m, d in cli.items() if d}, "only the front-ends (and entry points) import ulacache_cli"


def test_no_system_or_policy_name_branch_outside_their_classes():
    found = [f for f in name_branches(ROOT) if (f[0], f[2]) not in NAME_BRANCHES_ALLOWED]
    assert not found, ("system/policy name compared outside sim/systems.py and ulacache/policies/ (ask the System or "
                       f"policy class through its registry instead): {found}")
    left = {(f[0], f[2]) for f in name_branches(ROOT)}
    assert set(NAME_BRANCHES_ALLOWED) <= left, f"no longer needed: {sorted(set(NAME_BRANCHES_ALLOWED) - left)}"


def test_the_checks_see_what_they_look_for(tmp_path):
    """The checkers on a small tree: a lazy cycle, a relative import, a long function, a TYPE_CHECKING import."""
    pkg = tmp_path / "pa"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from . import b\n\n\ndef f():\n" + "    x = 1\n" * 60)
    (pkg / "b.py").write_text("def g():\n    from pa.a import f\n    return f\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pa import a\n")
    graph = import_graph(tmp_path, ("pa",))
    assert graph == {"pa": set(), "pa.a": {"pa.b"}, "pa.b": {"pa.a"}, "pa.c": set()}
    assert cycles(graph) == [["pa.a", "pa.b"]]
    assert long_functions(tmp_path) == [("pa/a.py", "f", 61)]
    assert cycles({"x": {"y"}, "y": set()}) == []
    (pkg / "d.py").write_text('def h(c, s):\n    return c.policy == "lru" or "sglang" != s or s in ("x",)\n')
    (tmp_path / "own").mkdir()
    (tmp_path / "own" / "e.py").write_text('X = 1 if "lru" == "lru" else 2\n')
    assert name_branches(tmp_path, owners=("own/",)) == [("pa/d.py", 2, "lru"), ("pa/d.py", 2, "sglang")]
