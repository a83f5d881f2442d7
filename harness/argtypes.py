"""Argument types of the ``harness`` command line: bad values stop at parse time (exit 2, one line
naming the option) instead of hanging a run or surfacing later as a traceback."""
from __future__ import annotations

import argparse
import math
from pathlib import Path

USAGE_ERROR = 2  # the exit status of every refused input (argparse's own)


class UsageError(ValueError):
    """A bad input found before a command ran or wrote anything; its message names the input and the fix."""


def positive_int(text: str) -> int:
    """An integer >= 1 (``--jobs``, ``--steps``, ``--timeout``: 0 would wait forever or run nothing)."""
    value = _int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer (use 1 or more)")
    return value


def non_negative_int(text: str) -> int:
    """An integer >= 0 (``--warmup``)."""
    value = _int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is negative (use 0 or more)")
    return value


def positive_float(text: str) -> float:
    """A number of seconds > 0 (``harness fuzz --case-timeout``: 0 would call every case a hang)."""
    value = _float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number (use more than 0)")
    return value


def non_negative_float(text: str) -> float:
    """A number of seconds >= 0 (``harness fuzz --seconds``; ``--shrink-seconds``, where 0 keeps each
    finding unshrunk)."""
    value = _float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is negative (use 0 or more)")
    return value


def width_list(text: str) -> list[int]:
    """Comma-separated positive integers (``--widths 64,128``)."""
    items = [w.strip() for w in text.split(",") if w.strip()]
    if not items:
        raise argparse.ArgumentTypeError("no widths given (e.g. --widths 64,128)")
    return [positive_int(w) for w in items]


def directory(text: str) -> Path:
    """A directory that exists or can be made: an existing file is refused before anything runs."""
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a file, not a directory (choose a directory)")
    return path


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None


def _float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """``--help`` with every option's default (unless its text already states one, or there is none) and
    the epilog's example lines kept as written."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if "default" in text.lower() or not shows_default(action):
            return text
        return super()._get_help_string(action)


def shows_default(action: argparse.Action) -> bool:
    """Whether ``--help`` states ``action``'s default: not for flags (False), unset values or empty lists
    (by identity: a default of 0 is shown)."""
    return not (action.default is None or action.default is False or action.default is argparse.SUPPRESS
                or (isinstance(action.default, list) and not action.default))


def command(sub: argparse._SubParsersAction, name: str, help: str, example: str) -> argparse.ArgumentParser:
    """A ``harness`` subcommand whose ``--help`` shows the defaults and ``example``."""
    return sub.add_parser(name, help=help, description=help[0].upper() + help[1:] + ".", formatter_class=HelpFormatter,
                          epilog="example:\n  " + example)
