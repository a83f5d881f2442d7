"""The expected-failures file (``ci/expected_op_failures.json``) of the generated op tests (``suite``
``registry``, the default: ``op`` is an aten overload) and of the OpInfo suites (``opinfo``: an OpInfo
name such as ``div.floor_rounding``; ``modules``: a module_db name such as ``nn.LSTM``; ``optim``: an
optimizer class name such as ``Adam``)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from reports.schema import DATABASES

PATH = Path(__file__).resolve().parent.parent / "ci" / "expected_op_failures.json"
CATEGORIES = ("not-implemented", "precision", "nondeterministic", "input-generation", "metadata-static")
SUITES = ("registry", *DATABASES)


@dataclass(frozen=True)
class ExpectedFailure:
    op: str
    dtype: str
    device: str
    category: str
    reason: str
    suite: str = "registry"

    def matches(self, op: str, dtypes: set[str], device: str, suite: str = "registry") -> bool:
        """``device`` is the backend string (``pfvm:cpu``, ``mncore2:auto``); an entry names one or ``*``."""
        return (self.suite == suite and self.op == op and (self.dtype == "*" or self.dtype in dtypes)
                and (self.device == "*" or self.device == device))


def load(path: Path = PATH) -> list[ExpectedFailure]:
    data = json.loads(path.read_text())
    out = []
    for i, e in enumerate(data.get("entries", [])):
        missing = [k for k in ("op", "dtype", "device", "category", "reason") if not e.get(k)]
        if missing:
            raise ValueError(f"{path}: entry {i} lacks {', '.join(missing)}")
        if e["category"] not in CATEGORIES:
            raise ValueError(f"{path}: entry {i} has category {e['category']!r}; use one of {', '.join(CATEGORIES)}")
        suite = e.get("suite", "registry")
        if suite not in SUITES:
            raise ValueError(f"{path}: entry {i} has suite {suite!r}; use one of {', '.join(SUITES)}")
        out.append(ExpectedFailure(e["op"], e["dtype"], e["device"], e["category"], e["reason"], suite))
    return out


def lookup(op: str, device: str, suite: str, entries: list[ExpectedFailure] | None = None) -> ExpectedFailure | None:
    """The float32 entry of ``op`` on ``device`` in ``suite`` (the OpInfo suites check float32 only)."""
    for x in load() if entries is None else entries:
        if x.matches(op, {"float32"}, device, suite):
            return x
    return None
