"""The expected-failures file of the generated op tests (``ci/expected_op_failures.json``)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

PATH = Path(__file__).resolve().parent.parent / "ci" / "expected_op_failures.json"
CATEGORIES = ("not-implemented", "precision", "nondeterministic", "input-generation", "metadata-static")


@dataclass(frozen=True)
class ExpectedFailure:
    op: str
    dtype: str
    device: str
    category: str
    reason: str

    def matches(self, op: str, dtypes: set[str], device: str) -> bool:
        return (self.op == op and (self.dtype == "*" or self.dtype in dtypes)
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
        out.append(ExpectedFailure(e["op"], e["dtype"], e["device"], e["category"], e["reason"]))
    return out
