"""Layering: the tools use mncore only through its public modules, and ``reports`` stands alone.

``reports`` reads results files and must not need the harness or mncore to do so; the harness, the
zoo, the shape registry, the reports and the benchmarks may import only mncore's public modules, so
that mncore's internals can move without breaking them. Nothing patches ``sys.path``.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]
TOOLS = ("harness", "model_zoo", "shape_registry", "reports", "benchmarks")
PUBLIC = {"mncore", "mncore.context", "mncore.metrics", "mncore.profile", "mncore.observe", "mncore.errors",
          "mncore.config"}
# benchmarks/ is outside this change; mncore.observe.clear_compile_cache() replaces its cache import
EXEMPT = {("benchmarks/perf_model.py", "mncore.lazy.graph")}


def _imports(path: Path) -> list[str]:
    """Every module ``path`` imports (``from mncore import observe`` counts as ``mncore.observe``)."""
    tree = ast.parse(path.read_text(), str(path))
    out: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append(node.module)
            out += [f"{node.module}.{a.name}" for a in node.names if _is_module(f"{node.module}.{a.name}")]
    return out


def _is_module(name: str) -> bool:
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _files(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def test_reports_imports_neither_harness_nor_mncore():
    bad = [f"{p.relative_to(ROOT)}: {m}" for p in _files("reports") for m in _imports(p)
           if m.split(".")[0] in ("harness", "mncore")]
    assert bad == []


def test_tools_import_only_public_mncore_modules():
    bad = [f"{p.relative_to(ROOT)}: {m}" for pkg in TOOLS for p in _files(pkg) for m in _imports(p)
           if m.split(".")[0] == "mncore" and m not in PUBLIC and (str(p.relative_to(ROOT)), m) not in EXEMPT]
    assert bad == []


def test_nothing_patches_sys_path():
    bad = [f"{p.relative_to(ROOT)}:{node.lineno}" for pkg in TOOLS for p in _files(pkg)
           for node in ast.walk(ast.parse(p.read_text()))
           if isinstance(node, ast.Attribute) and node.attr == "path"
           and isinstance(node.value, ast.Name) and node.value.id == "sys"]
    assert bad == []
