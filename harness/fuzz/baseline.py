"""Known fuzz findings judged not to be bugs (``ci/fuzz_baseline.json``): they are counted and listed
with their reason, and do not fail a campaign; any other finding does.

A finding is identified by its signature, ``op:kind:oracle`` (never by random values), and an entry
may also name text its message must contain (``match``, e.g. the exception class), so that another
failure of the same op and oracle is still a new finding.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from harness.fuzz import BASELINE as DEFAULT_PATH


class BaselineError(ValueError):
    """A baseline file that cannot be read; the message names the file, the entry and the fix."""


@dataclass(frozen=True)
class KnownFinding:
    signature: str
    reason: str
    match: str = ""

    def covers(self, signature: str, message: str) -> bool:
        return signature == self.signature and self.match in message


def load(path: Path = DEFAULT_PATH) -> list[KnownFinding]:
    """The entries of ``path``; ``BaselineError`` for a missing or malformed file or an entry without
    a signature (``op:kind:oracle``) or a reason."""
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise BaselineError(f"--baseline {path}: no such file (the default is {DEFAULT_PATH})") from None
    except json.JSONDecodeError as e:
        raise BaselineError(f"--baseline {path}: not valid JSON ({e})") from None
    entries = data.get("entries") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise BaselineError(f"--baseline {path}: expected an object with an 'entries' list")
    out = []
    for i, e in enumerate(entries):
        sig, reason = (e.get("signature"), e.get("reason")) if isinstance(e, dict) else (None, None)
        if not isinstance(sig, str) or sig.count(":") < 2 or not isinstance(reason, str) or not reason.strip():
            raise BaselineError(f"--baseline {path}: entry {i} needs a 'signature' (op:kind:oracle, as harness fuzz "
                                "prints it) and a 'reason' saying why it is not a bug")
        out.append(KnownFinding(sig, reason.strip(), str(e.get("match", ""))))
    return out


def lookup(entries: list[KnownFinding], signature: str, message: str) -> KnownFinding | None:
    """The entry that covers this finding, or None (a new finding)."""
    return next((k for k in entries if k.covers(signature, message)), None)
