"""The generated op tests (``tests/test_generated_ops.py``): which registry rows run, how they are grouped
into test items, and the check of one row against eager PyTorch on the CPU.

Rows of one op are grouped into items of up to ``MNCORE_OPTEST_BATCH`` rows (and about
``ITEM_ELEMENTS`` input elements, so that ``pytest -n auto`` can balance its workers): a pytest item
costs its setup, its report and its share of the collection, which for 20,000 one-row items cost more
than most rows' own check. Every row is still checked on its own, and a failing item names each
failing row (its id, as ``harness registry show`` prints it) with why.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc
import math
import random
from pathlib import Path
from typing import Callable

from harness.fuzz.oracles import judge, lazy_run
from harness.opgen import describe, make_inputs, resolve_op, to_device
from harness.registry_cmd import DEFAULT_PATH
from shape_registry import Registry
from shape_registry.format import Entry

ITEM_ELEMENTS = 20_000_000  # input elements per item at most (a larger row is an item of its own)
# After a row this large, freed memory is handed back to the system (see ``_give_back_memory``).
TRIM_ELEMENTS = 4_000_000


def rows(sample: int = 0, path: Path = DEFAULT_PATH) -> list[Entry]:
    """The registry's rows in key order; with ``sample`` > 0, a deterministic sample of about that many
    (every op keeps its first row, the rest drawn with a fixed seed)."""
    every = _sorted_rows(path)
    if not every:
        raise RuntimeError(f"{path} has no rows: regenerate it with `harness registry record`")
    if not sample or sample >= len(every):
        return list(every)
    first: dict[str, Entry] = {}
    for r in every:
        first.setdefault(r.op, r)
    keep = {id(r) for r in first.values()}
    rest = [r for r in every if id(r) not in keep]
    random.Random(0).shuffle(rest)
    chosen = list(first.values()) + rest[: max(0, sample - len(first))]
    return sorted(chosen, key=lambda r: r.key)


@functools.lru_cache(maxsize=2)
def _sorted_rows(path: Path) -> list[Entry]:
    """Read once per process (the sample and the stale-entry check both need it)."""
    return Registry.load(path).sorted()


def elements(row: Entry) -> int:
    """Input elements of a row (its cost, roughly: generating, copying and comparing them)."""
    return sum(math.prod(t["shape"]) for t in row.tensors())


def batches(selected: list[Entry], size: int) -> list[tuple[str, list[Entry]]]:
    """(id, rows) per test item: consecutive rows of one op, at most ``size`` rows and ``ITEM_ELEMENTS``
    input elements each; the id is the op and the item's place among that op's items."""
    by_op: dict[str, list[list[Entry]]] = {}
    for r in selected:
        items = by_op.setdefault(r.op, [[]])
        last = items[-1]
        if last and (len(last) >= size or sum(map(elements, last)) + elements(r) > ITEM_ELEMENTS):
            items.append(last := [])
        last.append(r)
    out = []
    for op, items in by_op.items():
        out += [(op if len(items) == 1 else f"{op}[{i + 1}of{len(items)}]", rs) for i, rs in enumerate(items)]
    return out


def check(row: Entry) -> str:
    """Why ``row`` disagrees with eager PyTorch on the CPU ("" when it agrees): the op on inputs regenerated
    from the row, lazily on ``mncore`` (the current device) and eagerly on the CPU, judged by
    ``harness.fuzz.oracles.judge`` (outputs and the arguments the op writes)."""
    try:
        return _verdict(row)
    finally:
        if elements(row) >= TRIM_ELEMENTS:
            _give_back_memory()


def _verdict(row: Entry) -> str:
    op = resolve_op(row.op)
    args, kwargs = make_inputs(row, seed=0)
    dev_args, dev_kwargs = to_device(args, "mncore"), to_device(kwargs, "mncore")  # copies: eager may write args
    try:
        want = op(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 - the generator must produce inputs eager accepts
        return f"eager PyTorch rejects the regenerated inputs: {type(e).__name__}: {e}"
    try:
        got, got_args, got_kwargs = lazy_run(op, dev_args, dev_kwargs)
    except Exception as e:  # noqa: BLE001 - reported as this row's failure; the item's other rows go on
        return f"mncore raises {type(e).__name__}: {e}"
    verdict = judge(row.op, got, want, got_args, got_kwargs, args, kwargs)
    return "" if verdict else verdict.message


def _give_back_memory() -> None:
    """Return the memory a large row freed to the system. glibc keeps freed heap memory for reuse, and
    the mix of tensor sizes in optimizer rows (a whole model's parameters, several copies) left each
    ``pytest -n auto`` worker holding the peak of every large row it had checked: over the whole set,
    workers reached 20 GB and were killed on a 24 GB machine. Elsewhere (no glibc) this only collects."""
    gc.collect()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):  # not glibc
        return None


def describe_failures(failures: list[tuple[Entry, str]], checked: int) -> str:
    """The failing rows of an item, one line each: the row's id, then why."""
    return f"{len(failures)} of {checked} rows disagree with eager CPU:\n" + \
        "\n".join(f"  {describe(r)}: {why}" for r, why in failures)
