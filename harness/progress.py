"""Progress for long runs: a tqdm bar on a terminal, one line per finished item otherwise (logs, CI)."""
from __future__ import annotations

import sys
import time
from typing import Any


class Progress:
    def __init__(self, total: int, desc: str):
        self.total, self.desc, self.done, self.t0 = total, desc, 0, time.monotonic()
        self.bar: Any = None
        if sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc=desc, unit="item")

    def step(self, label: str) -> None:
        self.done += 1
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix_str(label)
        else:
            print(f"[{self.desc} {self.done}/{self.total} {time.monotonic() - self.t0:6.0f}s] {label}",
                  file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
