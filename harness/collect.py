"""`harness zoo collect`: build every catalog candidate and train it one step, each in its own process
(``harness.cells``: a crash, an OOM or a hang is an excluded row with its reason, never a lost run),
derive its traits, and write the catalog file (``model_zoo/catalog/catalog.jsonl``).

The child (``python -m harness.collect NAME OUT``) builds the tiny config on CPU with random weights,
trains one step and writes one catalog row: ``ok`` with traits and timings, or ``excluded`` with why
(the config does not build, a file or the network is needed, the step fails or is not finite, or the
model is over ``MAX_PARAMS``).
"""
from __future__ import annotations

import json
import math
import sys
import tempfile
import time
import traceback
from collections import Counter
from pathlib import Path

from harness.cells import CellRunner, Job, Outcome
from harness.interrupt import Interrupted, signals_raise

MAX_PARAMS = 40_000_000  # the full tier trains every catalog model on every backend: bigger ones are left out
REASON_CHARS = 300
# imported once by the fork server every candidate is forked from (hundreds of candidates: importing
# torch and the libraries per process would cost more than building the models)
PRELOAD = ("torch", "transformers", "transformers.models.auto.modeling_auto", "torchvision", "model_zoo",
           "model_zoo.catalog.hf", "model_zoo.catalog.tv", "model_zoo.catalog.traits", "harness.collect")


def _source(name: str) -> str:
    return {"hf_": "transformers", "tv_": "torchvision"}.get(name[:3], "zoo")


def _params_on_meta(spec) -> int:  # noqa: ANN001 - a ModelSpec
    """The parameter count of the tiny build on the meta device (no memory, no init); 0 if it cannot."""
    import torch

    try:
        with torch.device("meta"):
            return sum(p.numel() for p in spec.build("tiny").parameters())
    except Exception:  # noqa: BLE001 - then the real build decides
        return 0


def probe(name: str) -> dict:
    """One catalog row for ``name`` (runs in the child)."""
    import torch

    import model_zoo
    from model_zoo.catalog import Entry
    from model_zoo.catalog.traits import derive, ops_of_step

    spec = model_zoo.get(name)
    task = spec.traits["task"]
    row = Entry(name=name, source=_source(name), family=spec.family, task=task, status="excluded")
    try:
        too_big = _params_on_meta(spec)
        if too_big > MAX_PARAMS:  # refused before a real build, which would take minutes (e.g. 600M weights)
            row.params = too_big
            row.reason = f"{too_big / 1e6:.0f}M parameters, over the catalog's {MAX_PARAMS // 10**6}M cap"
            return row.to_json()
        t0 = time.perf_counter()
        model = spec.build("tiny")
        row.build_s = round(time.perf_counter() - t0, 2)
        row.params = sum(p.numel() for p in model.parameters())
        if row.params > MAX_PARAMS:
            row.reason = f"{row.params / 1e6:.0f}M parameters, over the catalog's {MAX_PARAMS // 10**6}M cap"
            return row.to_json()
        batch = spec.make_batch("tiny")
        opt = spec.optimizer(model.parameters())
        losses = []
        t0 = time.perf_counter()
        ops = ops_of_step(lambda: losses.append(model_zoo.train_step(spec, model, opt, batch)))
        row.step_s = round(time.perf_counter() - t0, 2)  # with the op recording's overhead
        loss = losses[0]
        if loss.dim() != 0 or not math.isfinite(loss.item()):
            row.reason = f"the training step's loss is {loss.detach()} (not a finite scalar)"
            return row.to_json()
        row.traits = derive(model, task, ops)
        row.status = "ok"
    except Exception as e:  # noqa: BLE001 - the row records why the candidate is excluded
        where = traceback.extract_tb(e.__traceback__)[-1]
        row.reason = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:REASON_CHARS]
        row.reason += f" ({Path(where.filename).name}:{where.lineno})"
    del torch
    return row.to_json()


def collect(names: list[str], out: Path, jobs: int = 1, timeout: int = 300, headline: tuple[str, ...] = ()) -> int:
    """Probe every name in a child process; merge the rows into ``out`` (rows of names not probed stay)."""
    import torch
    import torchvision
    import transformers

    import model_zoo
    from model_zoo import catalog

    def finish(o: Outcome) -> catalog.Entry:
        if o.kind == "result":
            return catalog.Entry.from_json(json.loads(o.job.result.read_text()))
        spec = model_zoo.get(o.job.label)  # a spec is made without building anything
        return catalog.Entry(name=spec.name, source=_source(spec.name), family=spec.family, task=spec.traits["task"],
                             status="excluded", reason=f"{o.kind}: {o.reason}"[:REASON_CHARS])

    with tempfile.TemporaryDirectory() as tmp:
        todo = [Job(n, "harness.collect", (n, str(Path(tmp) / f"{n}.json")), Path(tmp) / f"{n}.json") for n in names]
        try:
            with signals_raise(), CellRunner(len(todo), "collecting", jobs=jobs, timeout=timeout,
                                             preload=PRELOAD) as runner:
                rows = runner.run(todo, finish, status=lambda e: e.status if e.status == "ok" else
                                  f"excluded: {e.reason[:100]}")
        except Interrupted as e:  # the children are already killed; the catalog file is left as it was
            print(f"harness zoo collect: interrupted by {e.name}; {out} not changed", file=sys.stderr)
            return e.exit_code
    for r in rows:
        r.headline = r.name in headline
    old = catalog.load(out)[1] if out.exists() else []
    probed = {r.name for r in rows}
    entries = [e for e in old if e.name not in probed] + rows
    header = {"torch": torch.__version__, "transformers": transformers.__version__,
              "torchvision": torchvision.__version__, "max_params": MAX_PARAMS}
    catalog.save(entries, header, out)
    ok = [e for e in entries if e.status == "ok"]
    print(f"wrote {out}: {len(entries)} tried, {len(ok)} ok ({len(ok) / max(1, len(entries)):.0%}) from "
          f"{len({e.family for e in ok})} families")
    for source, n in sorted(Counter(e.source for e in ok).items()):
        print(f"  ok from {source}: {n}")
    causes = Counter(e.reason.split(":")[0].split(" (")[0] for e in entries if e.status != "ok")
    print("  excluded by cause: " + ", ".join(f"{k} {v}" for k, v in causes.most_common(12)))
    return 0


if __name__ == "__main__":  # child: python -m harness.collect NAME OUT
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    result = probe(sys.argv[1])
    Path(sys.argv[2]).write_text(json.dumps(result))
