"""The compiler fingerprint (part of every disk-cache entry's name) changes with what shapes generated
code and with nothing else; the version has one source."""
from __future__ import annotations

import importlib.metadata
import shutil
from pathlib import Path

import mncore
from mncore.compile import fingerprint
from mncore.sim.cost import COSTS_JSON

PKG = Path(mncore.__file__).resolve().parent


def _version_of(tree: Path, monkeypatch) -> str:
    monkeypatch.setattr(fingerprint, "_PKG", tree)
    fingerprint._digest.cache_clear()
    try:
        return fingerprint.compiler_version(str(COSTS_JSON))
    finally:
        fingerprint._digest.cache_clear()


def test_fingerprint_ignores_tools_and_follows_the_compiler(tmp_path, monkeypatch):
    tree = tmp_path / "mncore"
    shutil.copytree(PKG, tree, ignore=shutil.ignore_patterns("__pycache__"))
    base = _version_of(tree, monkeypatch)
    for rel in ("compile/dump.py", "compile/codegen.py", "trace/host.py", "execute/executor.py"):
        (tree / rel).write_text((tree / rel).read_text() + "\n# an edit that changes no generated code\n")
    assert _version_of(tree, monkeypatch) == base
    for rel in ("compile/fusion.py", "sim/hardware.json"):
        saved = (tree / rel).read_text()
        (tree / rel).write_text(saved + "\n")
        assert _version_of(tree, monkeypatch) != base, rel
        (tree / rel).write_text(saved)
    assert _version_of(tree, monkeypatch) == base


def test_fingerprint_sources_exist():
    assert all((PKG / rel).is_file() for rel in fingerprint.SOURCES)


def test_one_version_source():
    assert importlib.metadata.version("mncore") == mncore.__version__
