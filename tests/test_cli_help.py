"""The command line explains itself: every ``harness`` command's ``--help`` shows each option's default
and an example that parses; ``--version`` says the one version pip and ``mncore.__version__`` agree on."""
from __future__ import annotations

import argparse
import importlib.metadata
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import mncore
from harness import cli
from harness.argtypes import shows_default

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]


def _commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every parser of the tree with the words that select it (``("registry", "show")``)."""
    out = [(path, parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                out += _commands(child, path + (name,))
    return out


COMMANDS = _commands(cli.build_parser())


def test_every_command_is_covered():
    names = {" ".join(p) for p, _ in COMMANDS}
    assert {"run", "report", "fuzz", "zoo list", "zoo collect", "registry record", "registry show"} <= names


@pytest.mark.parametrize("path,parser", COMMANDS, ids=[" ".join(p) or "harness" for p, _ in COMMANDS])
def test_help_shows_defaults_and_an_example_that_parses(path, parser):
    text = " ".join(parser.format_help().split())  # argparse wraps lines
    assert "example" in text, text
    for action in parser._actions:
        if not action.option_strings or not shows_default(action):
            continue
        assert action.help, f"{' '.join(path)} {action.option_strings[0]} has no help text"
        if "default" in action.help.lower():  # its text states the default itself
            continue
        shown = action.default if isinstance(action.default, (str, int, float)) else getattr(action.default, "label", None)
        assert shown is not None and f"(default: {shown})" in text, f"{' '.join(path)} {action.option_strings[0]}"
    epilog = parser.epilog or ""
    examples = [line.split("#")[0].strip() for line in epilog.splitlines() if line.startswith("  harness ")]
    assert examples, epilog
    for example in examples:
        words = shlex.split(example)[1:]
        if "<command>" in words:
            continue
        args = cli.build_parser().parse_args(words)  # a valid command line (argparse exits 2 otherwise)
        assert args.cmd == words[0]


def test_version_is_the_package_version():
    assert importlib.metadata.version("mncore") == mncore.__version__
    proc = subprocess.run([sys.executable, "-m", "harness.cli", "--version"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == f"harness (mncore) {mncore.__version__}", proc.stderr
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert 'dynamic = ["version"]' in pyproject and 'attr = "mncore._version.__version__"' in pyproject
