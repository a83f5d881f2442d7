"""One knob table: every ``MNCORE_*`` variable is a row of ``mncore/config.py``, read nowhere else,
documented by the table in docs/configuration.md generated from it, and a bad value names the variable and the
fix."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import mncore
from mncore import config
from mncore.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent


def test_configuration_page_table_is_the_generated_one():
    text = (ROOT / "docs" / "configuration.md").read_text()
    assert text.count("<!-- knobs:begin -->") == 1 and text.count("<!-- knobs:end -->") == 1
    table = text.split("<!-- knobs:begin -->\n", 1)[1].split("<!-- knobs:end -->", 1)[0]
    assert table.strip() == config.markdown_table().strip(), "run `python -m mncore.config` and paste the table"
    assert "docs/configuration.md" in (ROOT / "README.md").read_text(), "the README links the knob table"


def test_every_mncore_variable_mentioned_anywhere_is_a_knob():
    known = {k.env for k in config.KNOBS}
    files = [ROOT / "README.md", *ROOT.glob("docs/*.md")]
    for d in ("mncore", "harness", "tests", "benchmarks", "examples", "model_zoo", "shape_registry", "reports", "ci"):
        files += [p for p in (ROOT / d).rglob("*") if p.suffix in (".py", ".md", ".json", ".csv", ".txt")]
    files += [ROOT / "Makefile", ROOT / ".ci" / "run"]
    unknown = {}
    for f in files:
        for name in re.findall(r"MNCORE_[A-Z][A-Z0-9_]*", f.read_text(errors="replace")):
            if name not in known:
                unknown.setdefault(name, str(f.relative_to(ROOT)))
    assert unknown == {}


def test_only_config_reads_the_environment():
    readers = []
    for path in sorted((ROOT / "mncore").rglob("*.py")):
        if path.name == "config.py" and path.parent.name == "mncore":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv", "environb"):
                readers.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert readers == []


@pytest.mark.parametrize("var, value, allowed", [
    ("MNCORE_CACHE_SIZE", "abc", "positive integer"),
    ("MNCORE_CACHE_SIZE", "-1", "positive integer"),
    ("MNCORE_SIM_BOARDS", "0", "positive integer"),
    ("MNCORE_LOCK_TIMEOUT", "-1", "non-negative number of seconds"),
    ("MNCORE_SIM_DRAM_BYTES", "lots", "positive number of bytes"),
    ("MNCORE_EXECUTION", "fast", "sync, async_naive, async"),
    ("MNCORE_CACHE_READONLY", "maybe", "1 or 0"),
    ("MNCORE_DEBUG", "recompile,everything", "recompile"),
])
def test_bad_values_name_the_variable_and_the_allowed_values(monkeypatch, var, value, allowed):
    monkeypatch.setenv(var, value)
    with pytest.raises(ConfigError) as e:
        config.get(var)
    assert var in str(e.value) and allowed in str(e.value) and repr(value.split(",")[-1])[1:-1] in str(e.value)
    assert isinstance(e.value, ValueError)  # callers that caught ValueError keep working


def test_good_values_parse_to_their_types(monkeypatch):
    monkeypatch.setenv("MNCORE_CACHE_SIZE", "16")
    monkeypatch.setenv("MNCORE_LOCK_TIMEOUT", "0.5")
    monkeypatch.setenv("MNCORE_SIM_DRAM_BYTES", "1e6")
    monkeypatch.setenv("MNCORE_CACHE_READONLY", "1")
    assert (config.get("cache_size"), config.get("lock_timeout"), config.get("sim_dram_bytes"),
            config.get("cache_readonly")) == (16, 0.5, 1_000_000, True)
    monkeypatch.delenv("MNCORE_CACHE_SIZE")
    assert config.get("MNCORE_CACHE_SIZE") == 1024


def test_override_is_scoped_and_beats_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("MNCORE_CACHE_DIR", str(tmp_path / "env"))
    with config.override(cache_dir=str(tmp_path / "outer")):
        with config.override(cache_dir=str(tmp_path / "inner")):
            assert config.get("cache_dir") == str(tmp_path / "inner")
        assert config.get("cache_dir") == str(tmp_path / "outer")
    assert config.get("cache_dir") == str(tmp_path / "env")
    with pytest.raises(KeyError, match="no knob 'cache_dri'"):
        with config.override(cache_dri="x"):
            pass


def test_init_names_a_bad_environment_value(monkeypatch):
    monkeypatch.setenv("MNCORE_EXECUTION", "fast")
    with pytest.raises(ConfigError, match="MNCORE_EXECUTION must be one of sync, async_naive, async"):
        mncore.init_cpu()
    monkeypatch.delenv("MNCORE_EXECUTION")
    with pytest.raises(ConfigError, match=r"execution must be one of .*got 'fast' \(the argument, or MNCORE_EXECUTION\)"):
        mncore.init_cpu(execution="fast")
    assert mncore.settings.device == "pfvm:cpu" and mncore.settings.execution == "async"
