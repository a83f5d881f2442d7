"""Imports point one way (docs/architecture.md): mncore's rooms in their documented order, tools on
mncore's public modules only, ``reports`` on neither harness nor mncore.

The checker parses every module's imports with ``ast`` (including imports inside functions), so a
hidden upward import is found as surely as a top-level one. It is tested on a synthetic tree too,
so that a checker that silently accepts everything would fail here.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# mncore's rooms, highest first: a room may import only rooms listed before it (and ``_version``).
ORDER = ["_version", "errors", "config", "observe", "ir", "sim", "compile", "devices", "execute", "graph", "cache",
         "trace", "capture", "context"]
# Public facades may import any room.
FACADES = {"__init__", "metrics", "profile", "_autoload"}
PUBLIC = {"mncore", "mncore.context", "mncore.metrics", "mncore.profile", "mncore.observe", "mncore.errors",
          "mncore.config"}
TOOLS = ["harness", "model_zoo", "shape_registry", "reports", "benchmarks", "examples"]


def imports_of(path: Path) -> list[tuple[str, int]]:
    """Every module a file imports (``from a import b`` counts ``a`` and ``a.b``), with line numbers."""
    tree = ast.parse(path.read_text(), filename=str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.module, node.lineno))
            out += [(f"{node.module}.{a.name}", node.lineno) for a in node.names]
    return out


def room_of(package: str, module: str) -> str | None:
    """``mncore.trace.host`` -> ``trace``; None for anything outside ``package``."""
    parts = module.split(".")
    if parts[0] != package:
        return None
    return parts[1] if len(parts) > 1 else "__init__"


def layering_errors(pkg_dir: Path, order: list[str], facades: set[str]) -> list[str]:
    """Upward imports and cycles between the rooms of the package at ``pkg_dir``."""
    package = pkg_dir.name
    rank = {room: i for i, room in enumerate(order)}
    errors, edges = [], {}
    for path in sorted(pkg_dir.rglob("*.py")):
        rel = path.relative_to(pkg_dir.parent).with_suffix("")
        here = room_of(package, ".".join(rel.parts).removesuffix(".__init__"))
        if here not in rank and here not in facades:
            errors.append(f"{path}: room {here!r} is not in the documented order")
            continue
        for target, line in imports_of(path):
            there = room_of(package, target)
            if there is None or there == here or there not in rank:
                continue
            edges.setdefault(here, set()).add(there)
            if here in facades:
                continue
            if rank[there] >= rank[here]:
                errors.append(f"{path}:{line}: {here} imports {target} ({there} is below {here})")
    errors += [f"import cycle between rooms: {' -> '.join(c)}" for c in _cycles(edges)]
    return errors


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    found, state = [], {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == "open":
                found.append(path[path.index(nxt):] + [nxt] if nxt in path else path + [nxt])
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = "done"

    for node in sorted(edges):
        if node not in state:
            visit(node, [node])
    return found


def exported(package_dir: Path) -> set[str]:
    """The names in a package's ``__all__`` (read with ``ast``; empty when it has none)."""
    init = package_dir / "__init__.py"
    if not init.exists():
        return set()
    for node in ast.parse(init.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "__all__" for t in node.targets):
            return set(ast.literal_eval(node.value))
    return set()


def public_errors(tool_dir: Path, mncore_dir: Path) -> list[str]:
    """Imports of mncore internals (anything but ``PUBLIC`` and their attributes) from a tool's files."""
    def is_module(*parts: str) -> bool:
        return (mncore_dir.joinpath(*parts)).is_dir() or mncore_dir.joinpath(*parts[:-1], parts[-1] + ".py").exists()

    errors = []
    for path in sorted(tool_dir.rglob("*.py")):
        for target, line in imports_of(path):
            parts = target.split(".")
            if parts[0] != "mncore" or target in PUBLIC:
                continue
            head = ".".join(parts[:2])
            if len(parts) == 2 and not is_module(parts[1]):
                continue  # ``from mncore import sync``: an attribute of the package
            if len(parts) == 3 and head in PUBLIC and (not is_module(parts[1], parts[2])
                                                       or parts[2] in exported(mncore_dir / parts[1])):
                continue  # ``from mncore.context import Context``: what a public module exports
            errors.append(f"{path}:{line}: imports {target}, which is not one of mncore's public modules")
            break  # one report per file is enough to act on
    return errors


def test_mncore_rooms_import_only_upwards():
    assert layering_errors(ROOT / "mncore", ORDER, FACADES) == []


@pytest.mark.parametrize("tool", TOOLS)
def test_tools_use_only_public_mncore_modules(tool):
    assert public_errors(ROOT / tool, ROOT / "mncore") == []


def test_reports_import_neither_harness_nor_mncore():
    bad = [f"{p}:{line}: {t}" for p in sorted((ROOT / "reports").rglob("*.py"))
           for t, line in imports_of(p) if t.split(".")[0] in ("harness", "mncore")]
    assert bad == []


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        f = tmp_path / "pkg" / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
    return tmp_path / "pkg"


def test_checker_finds_an_upward_import_hidden_in_a_function(tmp_path):
    pkg = _tree(tmp_path, {"__init__.py": "", "low/__init__.py": "", "high/__init__.py": "",
                           "high/a.py": "def f():\n    from pkg.low import x\n",
                           "low/b.py": "def g():\n    import pkg.high.a\n"})
    errors = layering_errors(pkg, ["high", "low"], {"__init__"})
    assert any("a.py:2: high imports pkg.low" in e for e in errors), errors
    assert any("import cycle" in e and "high" in e and "low" in e for e in errors), errors


def test_checker_accepts_a_clean_tree_and_flags_internal_tool_imports(tmp_path):
    pkg = _tree(tmp_path, {"__init__.py": "", "high/__init__.py": "", "low/__init__.py": "import pkg.high\n"})
    assert layering_errors(pkg, ["high", "low"], {"__init__"}) == []
    tool = tmp_path / "tool"
    tool.mkdir()
    (tool / "t.py").write_text("import mncore\nfrom mncore.context import Context\nfrom mncore.trace import sync\n")
    (tmp_path / "mncore" / "trace").mkdir(parents=True)
    (tmp_path / "mncore" / "context").mkdir()
    errors = public_errors(tool, tmp_path / "mncore")
    assert len(errors) == 1 and "mncore.trace" in errors[0], errors


def test_nothing_patches_sys_path():
    bad = [f"{p.relative_to(ROOT)}:{node.lineno}" for tool in TOOLS for p in sorted((ROOT / tool).rglob("*.py"))
           for node in ast.walk(ast.parse(p.read_text()))
           if isinstance(node, ast.Attribute) and node.attr == "path"
           and isinstance(node.value, ast.Name) and node.value.id == "sys"]
    assert bad == []
