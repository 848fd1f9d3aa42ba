"""The folder tree is the flow: each stage imports only the stages before it."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "tosakit"
# base modules, then the stages in flow order; the top level (cli, flow, zoo, __init__) may use all
ORDER = ["errors", "lazy", "native", "targets", "specs", "capture", "quantize", "partition", "lower", "backends", "program",
         "runtime", "verify"]
RANK = {name: i for i, name in enumerate(ORDER)}
TOP = len(ORDER)


def _rank(module: str) -> int:
    return RANK.get(module.split(".")[0], TOP)


def _is_module(module: str) -> bool:
    base = SRC.joinpath(*module.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def _imports(path: Path) -> list[tuple[str, int]]:
    """tosakit-internal modules imported by ``path`` (relative imports resolved), with line numbers."""
    package = path.relative_to(SRC).with_suffix("").parts
    package = package[:-1] if package[-1] != "__init__" else package[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = list(package[: len(package) - node.level + 1])
                target = ".".join(base + ([node.module] if node.module else []))
                if not node.module:
                    found += [(f"{target}.{a.name}".lstrip("."), node.lineno) for a in node.names]
                    continue
            elif node.module and node.module.startswith("tosakit"):
                target = node.module[len("tosakit."):] if node.module != "tosakit" else ""
            else:
                continue
            # ``from .pkg import mod`` imports the submodule pkg/mod.py, not just the package
            subs = [f"{target}.{a.name}" for a in node.names if _is_module(f"{target}.{a.name}")]
            found += [(t, node.lineno) for t in subs] or [(target, node.lineno)]
        elif isinstance(node, ast.Import):
            found += [(a.name[len("tosakit."):], node.lineno) for a in node.names if a.name.startswith("tosakit.")]
    return [(t, ln) for t, ln in found if t]


def test_stages_import_only_earlier_stages():
    problems = []
    for path in sorted(SRC.rglob("*.py")):
        own = _rank(".".join(path.relative_to(SRC).with_suffix("").parts))
        if own == TOP:
            continue
        for target, line in _imports(path):
            if _rank(target) > own:
                problems.append(f"{path.relative_to(SRC)}:{line} imports {target} (a later stage)")
    assert not problems, "\n".join(problems)


def test_the_checker_sees_relative_imports():
    """Guard against a checker that finds nothing: program/ imports backends and lower."""
    targets = {t.split(".")[0] for t, _ in _imports(SRC / "program" / "manager.py")}
    assert {"backends", "lower", "capture", "partition"} <= targets


def test_tosakit_never_imports_executorch():
    for path in SRC.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not any(n.split(".")[0] == "executorch" for n in names), f"{path} imports executorch"


MAX_LINES = 600


def _module_file(module: str) -> Path | None:
    """The file a dotted tosakit module names (``a.b`` -> a/b.py or a/b/__init__.py); a name imported from a
    package (``from .pkg import name``) falls back to the package."""
    parts = module.split(".")
    while parts:
        base = SRC.joinpath(*parts)
        for path in (base.with_suffix(".py"), base / "__init__.py"):
            if path.is_file():
                return path
        parts = parts[:-1]
    return None


def _import_graph() -> dict[Path, set[Path]]:
    """file -> the tosakit files it imports, at top level or inside functions."""
    graph = {}
    for path in sorted(SRC.rglob("*.py")):
        targets = {_module_file(t) for t, _ in _imports(path)}
        graph[path] = {t for t in targets if t is not None and t != path}
    return graph


def _circles(graph: dict[Path, set[Path]]) -> list[list[Path]]:
    """The strongly connected groups of more than one file (Tarjan)."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_no_import_circles():
    """No file imports itself through others, not even from inside a function."""
    circles = _circles(_import_graph())
    assert not circles, "import circles:\n" + "\n".join(
        " <-> ".join(str(p.relative_to(SRC)) for p in group) for group in circles)


def test_the_circle_finder_sees_a_circle():
    """Guard against a finder that finds nothing."""
    a, b, c = Path("a"), Path("b"), Path("c")
    assert _circles({a: {b}, b: {c}, c: {a}}) == [[a, b, c]]
    assert _circles({a: {b}, b: {c}, c: set()}) == []


def test_no_source_file_over_the_line_cap():
    """Every file one job: none over MAX_LINES lines."""
    big = {str(p.relative_to(SRC)): n for p in SRC.rglob("*.py") if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not big, f"files over {MAX_LINES} lines (split them along their jobs): {big}"
