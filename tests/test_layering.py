"""The folder tree is the flow: each stage imports only the stages before it."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "tosakit"
# base modules, then the stages in flow order; the top level (cli, flow, zoo, __init__) may use all
ORDER = ["errors", "lazy", "native", "specs", "capture", "quantize", "partition", "lower", "backends", "program", "runtime"]
RANK = {name: i for i, name in enumerate(ORDER)}
TOP = len(ORDER)


def _rank(module: str) -> int:
    return RANK.get(module.split(".")[0], TOP)


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
            found.append((target, node.lineno))
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
