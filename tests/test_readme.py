"""The README's tour runs as written: each ```python block in a fresh interpreter (each compares its own
results with eager PyTorch and raises when they differ), each `harness` line names a subcommand and
flags that exist, `mncore-dump` reads the codegen directory the Context example wrote, and the one
fast `harness run` line passes."""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
BIN = Path(sys.executable).parent
TOUR_TMP = "/tmp/mncore-tour"  # the directory the tour writes to, replaced by a private one here


def blocks(lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", README, flags=re.S | re.M)


def shell_lines() -> list[str]:
    """Command lines of the README's sh blocks, comments stripped."""
    return [line.split("  #", 1)[0].split(" # ", 1)[0].strip() for b in blocks("sh") for line in b.splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def env(tmp_path: Path) -> dict[str, str]:
    """The user's environment without mncore knobs, with a private board-lock directory."""
    e = {k: v for k, v in os.environ.items() if not k.startswith("MNCORE_")}
    e.update(HF_HUB_OFFLINE="1", MNCORE_RUNTIME_DIR=str(tmp_path / "runtime"), PYTHONPATH=str(ROOT))
    return e


def test_the_tour_has_its_examples():
    code = blocks("python")
    assert len(code) == 4, "lazy mode, capture, Context API, simulated board"
    assert all("assert" in b for b in code), "every example checks what it computes"
    assert any("mncore2:auto" in b and "performance" in b for b in code)
    harness = [line for line in shell_lines() if line.startswith("harness ")]
    assert {line.split()[1] for line in harness} >= {"run", "report"}


@pytest.mark.parametrize("index", range(4))
def test_python_block_runs(tmp_path, index):
    block = blocks("python")[index]
    code = block.replace(TOUR_TMP, str(tmp_path / "tour"))
    run = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env(tmp_path), capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip(), "each example prints what it checked"
    if "context.compile" in block:  # the sh line after it dumps the codegen directory it wrote
        assert TOUR_TMP in block
        (dump,) = [line for line in shell_lines() if line.startswith("mncore-dump ")]
        target = dump.split()[1].replace(TOUR_TMP, str(tmp_path / "tour"))
        out = subprocess.run([str(BIN / "mncore-dump"), target], env=env(tmp_path), capture_output=True,
                             text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        assert "inputs:" in out.stdout and "x: DRAM@" in out.stdout and "out: DRAM@" in out.stdout


def test_the_context_example_is_the_one_mncore_dump_reads():
    (context,) = [b for b in blocks("python") if "context.compile" in b]
    (dump,) = [line for line in shell_lines() if line.startswith("mncore-dump ")]
    assert dump.split()[1] in context


def _help(sub: list[str]) -> str:
    run = subprocess.run([str(BIN / "harness"), *sub, "--help"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    return run.stdout


def test_harness_lines_use_existing_subcommands_and_flags():
    for line in shell_lines():
        words = shlex.split(line)
        if words[0] != "harness":
            continue
        sub = [words[1]]
        text = _help(sub)
        for flag in (w.split("=", 1)[0] for w in words[2:] if w.startswith("--")):
            assert flag in text, f"README: `{line}`: `harness {words[1]}` has no {flag}"
        if words[1] == "report":
            assert words[2] in text, f"README: `{line}`: no report {words[2]}"


def test_the_fast_harness_line_passes(tmp_path):
    (line,) = [line for line in shell_lines() if line.startswith("harness run") and "--models" in line]
    words = shlex.split(line.replace("/tmp/mncore-run", str(tmp_path / "run")))
    run = subprocess.run([str(BIN / "harness"), *words[1:]], cwd=ROOT, env=env(tmp_path), capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert (tmp_path / "run" / "results.jsonl").exists()


def test_commands_the_readme_names_are_installed():
    for line in shell_lines():
        exe = shlex.split(line)[0]
        if exe in ("harness", "mncore-dump"):
            assert (BIN / exe).exists(), f"{exe} is not in {BIN}"
        elif exe.startswith(".venv/bin/"):
            assert (BIN / Path(exe).name).exists()
        elif exe == "make":
            target = shlex.split(line)[1]
            assert re.search(rf"^{re.escape(target)}:", (ROOT / "Makefile").read_text(), flags=re.M), target
        elif exe in ("source", "python"):
            pass
        else:
            raise AssertionError(f"README sh line `{line}`: unknown command {exe}")
    assert (ROOT / "examples" / "context" / "add.py").exists() and (ROOT / "examples" / "lazy_mlp.py").exists()
