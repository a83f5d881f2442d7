"""The documentation stays true to the results: docs/figures.md is what ``make figures`` renders from the
committed results files, no other page hand-writes a measured figure that the results do not hold, every
link points at a file of this repository, and every term the README uses is in the glossary."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from reports import figures

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
FIGURES = DOCS / "figures.md"

# A measured figure: any number of ms, µs, minutes or cases/s; a decimal number of seconds, percent or
# times (×); whole seconds and percentages are settings (timeouts, thresholds), whole × are counts.
# Limits and settings say so within a few words before them (≤, default, ...).
FIGURE = re.compile(r"(?<![\w.@=-])(?:\d[\d,]*(?:\.\d+)?\s?(?:ms|µs|us|cases/s|min)\b|"
                    r"\d[\d,]*\.\d+\s?(?:s\b|%|×|x\b))")
SETTING = re.compile(r"(≤|<|>|at most|at least|within|target|default|timeout|budget|per distinct|threshold|every|"
                     r"after|up to|plus|cap|--\w[\w-]*|one line|line every)\W*(\w+\W+){0,3}$", re.I)


def pages() -> list[Path]:
    return [ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "CHANGELOG.md",
            *sorted(p for p in DOCS.glob("*.md") if p != FIGURES)]


def prose(path: Path) -> str:
    """A page without its fenced code blocks (example output, commands) and inline code spans."""
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "`…`", text)


def test_figures_page_is_rendered_from_the_results_files():
    assert FIGURES.read_text() == figures.render(), "results changed: run `make figures` and commit docs/figures.md"


def test_figures_page_carries_provenance_and_the_headline_tables():
    text = FIGURES.read_text()
    for heading in ("MLP width sweep", "three execution modes", "ResNet-18 and GPT-2 small", "Models tier",
                    "Conformance"):
        assert f"## {heading}" in text or heading in text, heading
    assert text.count("Measured 20") >= 3 and "at commit `" in text and "cores" in text


def test_figures_check_mode_fails_on_a_stale_page(tmp_path, capsys):
    stale = tmp_path / "figures.md"
    stale.write_text(figures.render().replace("| pfvm:cpu |", "| pfvm:cpu (edited) |", 1))
    assert figures.main(["--check", "--out", str(stale)]) == 1
    assert "make figures" in capsys.readouterr().err
    stale.write_text(figures.render())
    assert figures.main(["--check", "--out", str(stale)]) == 0


def stray_figures(text: str, generated: str) -> list[str]:
    """The measured figures of ``text`` (prose) whose number ``generated`` does not hold (its tables give
    units in the column headers)."""
    stray = []
    for m in FIGURE.finditer(text):
        before = text[max(0, m.start() - 40):m.start()]
        number = re.match(r"[\d,.]+", m.group(0)).group(0).rstrip(".,")
        if SETTING.search(before) or re.search(rf"(?<![\d.]){re.escape(number)}(?![\d])", generated):
            continue
        stray.append(f"{m.group(0)} (after …{before[-30:]})")
    return stray


def test_the_figure_check_finds_a_stale_figure():
    generated = FIGURES.read_text()
    made_up = "| GPT-2 small | 12.0 ms | 1.5 µs | 2.00× |"  # a fixed stand-in: today's figures may hold any number
    found = stray_figures("GPT-2 small traces in 97.5 ms per step, 34.5 µs per op, 3.43× faster", made_up)
    assert [f.split(" (after")[0] for f in found] == ["97.5 ms", "34.5 µs", "3.43×"]
    assert stray_figures("GPT-2 small traces in 12.0 ms per step, 2.00× faster", made_up) == []
    assert stray_figures("a timeout of 600 s (default 1.5 s); target ≤ 1.05×; 10 % noise threshold", generated) == []
    quoted = re.search(r"\| pfvm:cpu \| 4096 \| (\d[\d.]*) ", generated).group(1)  # the Context step at w=4096
    assert stray_figures(f"the Context step takes {quoted} ms", generated) == []


@pytest.mark.parametrize("page", pages(), ids=lambda p: p.name)
def test_no_hand_written_measured_figures(page):
    """A measured figure outside docs/figures.md must be one the generated page holds (so it came from a
    results file); limits, settings and counts of things are not measurements."""
    stray = stray_figures(prose(page), FIGURES.read_text())
    assert stray == [], f"{page.name}: quote these from docs/figures.md (make figures) instead: {stray}"


def anchors(path: Path) -> set[str]:
    """GitHub's anchors of a Markdown file's headings (lower case, punctuation dropped, spaces to -)."""
    heads = re.findall(r"^#+ (.+)$", re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M), flags=re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in heads}


def test_links_stay_inside_the_repository_and_resolve():
    for page in [*pages(), FIGURES]:
        text = page.read_text()
        assert not re.search(r"\.\./shared|shared/(seeds|research|ARCHITECTURE)", text), \
            f"{page.name} refers to the design material outside the repository"
        for target, anchor in re.findall(r"\]\(([^)#\s]*)(?:#([^)]*))?\)", text):
            assert not re.match(r"https?://", target), f"{page.name}: external link {target}"
            resolved = (page.parent / target).resolve() if target else page
            assert resolved.is_relative_to(ROOT) and resolved.exists(), f"{page.name}: broken link {target}"
            if anchor and resolved.suffix == ".md":
                assert anchor in anchors(resolved), f"{page.name}: no heading #{anchor} in {target or page.name}"


def test_every_page_is_linked_from_the_readme():
    readme = (ROOT / "README.md").read_text()
    for page in DOCS.glob("*.md"):
        assert f"docs/{page.name}" in readme, f"README does not link docs/{page.name}"


@pytest.mark.parametrize("term", ["MLSDK", "pfvm", "seed 000", "rooms", "torch_mncore", "modelled device time",
                                  "performance mode", "Context API", "lazy mode", "the three execution modes"])
def test_jargon_is_in_the_glossary(term):
    assert term.lower() in (DOCS / "glossary.md").read_text().lower()


def test_readme_explains_its_terms_and_cites_sources_by_name():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) < 200
    assert "docs/glossary.md" in readme and "source .venv/bin/activate" in readme and ".venv/bin/harness" in readme
    for word in ("seed 000", "seed's", "rooms", "shared/seeds", "_1b2fd7b3"):
        assert word not in readme, word
    for page in pages():
        assert not re.search(r"\b00[0-4]_[0-9a-f]{6}", page.read_text()), f"{page.name} cites a source by file name"


def test_the_cluster_section_renders_the_benchmarks_results_file(tmp_path):
    """``benchmarks/cluster_overhead.py`` writes a results file; figures.md shows its two wall times, the
    ratio judged against the target, and the plan, with where and when it was measured."""
    path = tmp_path / "results.json"
    path.write_text(json.dumps({
        "written_by": "benchmarks/cluster_overhead.py", "when": "2026-12-01T19:00:00", "commit": "abc1234",
        "machine": "x86_64, 2 cores", "loadavg_start": [1.5, 1, 1], "loadavg_end": [2.5, 1, 1],
        "command": "python benchmarks/cluster_overhead.py", "models": "the models tier", "jobs": 2, "steps": 3,
        "threads": "OMP_NUM_THREADS=1", "cells": 19, "local_s": 300.0, "ray_s": 330.0, "ratio": 1.1,
        "target": 1.15, "cell_wall_s": 580.0, "longest_cell_s": 90.0, "cpus_per_node": 2, "overhead_s": 1.58,
        "plan": [{"nodes": 1, "slots": 2, "speedup": 1.0}, {"nodes": 2, "slots": 4, "speedup": 1.8}]}))
    text = "\n".join(figures.cluster_section(path))
    assert "| 19 | 300.0 s | 330.0 s | 1.100 | ≤ 1.15 | met |" in text
    assert "commit `abc1234`" in text and "load average 1.5, 2.5" in text
    assert "| 2 | 4 | 1.8 |" in text
    slow = {**json.loads(path.read_text()), "ray_s": 400.0, "ratio": 1.333}
    path.write_text(json.dumps(slow))
    assert "| 1.333 | ≤ 1.15 | NOT met |" in "\n".join(figures.cluster_section(path))


def test_the_optest_section_renders_the_benchmarks_results_file(tmp_path):
    """``benchmarks/optest_rate.py`` writes a results file; figures.md shows each layout's rows per second
    judged against the target, says when the rate is a sample's, and names where it was measured."""
    path = tmp_path / "optest_rate.json"
    record = {
        "written_by": "benchmarks/optest_rate.py", "when": "2026-12-02T01:00:00", "commit": "abc1234",
        "machine": "x86_64, 2 cores", "loadavg_start": [0.5, 1, 1], "loadavg_end": [2.0, 1, 1],
        "command": "python benchmarks/optest_rate.py --sample 1500 --per-row", "sample": 1500, "rows": 1500,
        "registry_rows": 20659, "registry_ops": 205, "workers": "auto",
        "time": "measured wall time, pfvm:cpu, 2 cores", "collection": {"wall_s": 11.6, "pytest": "collected"},
        "runs": [{"layout": "grouped", "batch": None, "wall_s": 30.0, "rows_per_s": 50.0, "pytest": "ok"},
                 {"layout": "per row", "batch": 1, "wall_s": 100.0, "rows_per_s": 15.0, "pytest": "ok"}],
        "target_rows_per_s": 40.0}
    path.write_text(json.dumps(record))
    text = "\n".join(figures.optest_section(path))
    assert "| grouped | 1,500 | 30.0 s | 50.0 | ≥ 40 | met (on a sample) | ok |" in text
    assert "| per row | 1,500 | 100.0 s | 15.0 | ≥ 40 | NOT met (on a sample) | ok |" in text
    assert "20,659 rows over 205 distinct ops" in text and "commit `abc1234`" in text
    assert "load average 0.5, 2.0" in text and "`MNCORE_OPTEST_SAMPLE=1500`" in text
    path.write_text(json.dumps({**record, "sample": 0, "rows": 20659}))
    whole = "\n".join(figures.optest_section(path))
    assert "Every row of the shape registry" in whole and "| grouped | 20,659 | 30.0 s | 50.0 | ≥ 40 | met |" in whole


def test_a_benchmark_never_replaces_a_results_file_it_did_not_write(tmp_path):
    from harness.results import write_owned_json

    theirs = tmp_path / "results.json"
    theirs.write_text('{"mine": true}')
    with pytest.raises(SystemExit, match="was not written by benchmarks/x.py; pass another --results path"):
        write_owned_json(theirs, {"rate": 1}, "benchmarks/x.py")
    assert theirs.read_text() == '{"mine": true}'
    ours = tmp_path / "sub" / "ours.json"
    write_owned_json(ours, {"rate": 1}, "benchmarks/x.py")
    write_owned_json(ours, {"rate": 2}, "benchmarks/x.py")  # its own file: replaced
    assert json.loads(ours.read_text()) == {"written_by": "benchmarks/x.py", "rate": 2}
