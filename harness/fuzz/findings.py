"""Findings: failure signatures, deduplication, standalone repro scripts and their inputs.

A finding is identified by ``op:kind:oracle`` (``aten.mul.Tensor:mismatch:lazy_vs_eager``); each
distinct one gets three files under ``<out>/findings/`` named by the signature with ``:`` written
as ``__`` (portable file names):
  ``<stem>.py``   a repro script that loads the exact inputs, imports the plugin (if the campaign
                  had one), runs eager and mncore and asserts they agree, so it exits non-zero
                  while the bug exists (``--no-plugin`` runs it without the plugin);
  ``<stem>.pt``   the inputs (``torch.save`` of the argument lists: layouts and strides included);
  ``<stem>.json`` the original and shrunk fuzz cases (``Case.from_json(...).build_inputs()``
                  rebuilds the same inputs from the seed), the failure message and the campaign.
"""
from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path
from typing import Any

import torch

from harness.fuzz.cases import Case, mutation_label

REPO_ROOT = Path(__file__).resolve().parents[2]


def signature(op: str, result: dict) -> str | None:
    """``op:kind:oracle`` for a failing outcome, None otherwise."""
    if result.get("status") != "fail":
        return None
    return f"{op}:{result['kind']}:{result['oracle']}"


def file_stem(sig: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", sig.replace(":", "__"))


_HEADER = '''\
#!/usr/bin/env python3
"""Repro of {sig} (found by `harness fuzz`); exits non-zero while the bug exists.

{description}
Failure: {message}
Campaign: {command}
  case {index}; shrunk from {numel_before} to {numel_after} input elements; mutations: {mutations}
Inputs: {stem}.pt next to this file (torch.save of the exact arguments); {stem}.json holds the fuzz
case, which rebuilds them: harness.fuzz.cases.Case.from_json(d["shrunk_case"]).build_inputs().
Run: python {stem}.py [--no-plugin]   (--no-plugin: without the plugin module {plugin_text})
"""
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [{root!r}, str(Path.cwd())]  # the checkout the campaign ran in (harness, plugin)

import torch  # noqa: E402

import mncore  # noqa: E402
from harness.compare import compare  # noqa: E402,F401
from harness.fuzz import heap_check, oracles  # noqa: E402,F401
from harness.fuzz.worker import load_plugin  # noqa: E402
from harness.opgen import resolve_op  # noqa: E402  (imports torchvision for its ops)

OP = {op!r}
BACKEND = {backend!r}
PLUGIN = {plugin!r}
WEIGHT_SEED = {weight_seed!r}  # the gradient oracle's output weights, the capture oracle's scale factors


def setup() -> tuple:
    if PLUGIN and "--no-plugin" not in sys.argv:
        load_plugin(PLUGIN)
    mncore.init(BACKEND, implicit_sync="silent")
    inputs = torch.load(HERE / "{stem}.pt", weights_only=True)
    return resolve_op(OP), inputs["args"], inputs["kwargs"]

'''

_BODIES = {
    "lazy_vs_eager": '''
def main() -> None:
    op, args, kwargs = setup()
    want, want_args, want_kwargs = oracles.eager_call(op, args, kwargs)  # eager PyTorch on CPU
    got, got_args, got_kwargs = oracles.lazy_call(op, args, kwargs)     # lazy mode on mncore
    verdict = oracles.judge(OP, got, want, got_args, got_kwargs, want_args, want_kwargs)
    if not verdict:
        oracles.show(got, want)
    assert verdict, f"mncore disagrees with eager: {verdict.message}"
    print("mncore agrees with eager")
''',
    "accepts_invalid": '''
def main() -> None:
    op, args, kwargs = setup()
    try:
        oracles.eager_call(op, args, kwargs)
    except Exception as e:  # noqa: BLE001
        print(f"eager raises (expected): {type(e).__name__}: {e}")
    else:
        sys.exit("eager no longer rejects these inputs: the repro does not apply to this torch")
    try:
        oracles.lazy_call(op, args, kwargs)
    except Exception as e:  # noqa: BLE001
        print(f"mncore raises too: {type(e).__name__}: {e}")
        return
    raise AssertionError("mncore returned a result for inputs eager rejects")
''',
    "context_vs_lazy": '''
def main() -> None:
    from mncore.context import Context, MNDevice

    op, args, kwargs = setup()
    context = Context(MNDevice(BACKEND))
    Context.switch_context(context)
    got, got_args, got_kwargs = oracles.lazy_call(op, args, kwargs)  # lazy mode (agrees with eager)
    lazy = oracles.result_dict(op, got, got_args, got_kwargs)
    with tempfile.TemporaryDirectory() as codegen_dir:  # Context API: compile and call once
        compiled, proxies = oracles.context_call(op, args, kwargs, context, codegen_dir)
    for k, (shape, dtype) in proxies.items():
        print(f"{k}: TensorProxy {shape} {dtype}; .cpu() {list(compiled[k].shape)} {compiled[k].dtype}; "
              f"lazy {list(lazy[k].shape) if k in lazy else None} {lazy[k].dtype if k in lazy else None}")
        assert (list(compiled[k].shape), compiled[k].dtype) == (shape, dtype), f"{k}: TensorProxy metadata is wrong"
    verdict = oracles.judge_dicts(OP, compiled, lazy)
    assert verdict, f"Context API disagrees with lazy mode: {verdict.message}"
    print("Context API agrees with lazy mode")
''',
    "captured_vs_lazy": '''
def main() -> None:
    op, args, kwargs = setup()
    got, got_args, got_kwargs = oracles.lazy_call(op, args, kwargs)  # lazy mode, traced
    # mncore.capture: recorded twice on scaled values, replayed on these
    try:
        cap, cap_args, cap_kwargs = oracles.captured_call(op, args, kwargs, WEIGHT_SEED)
    except oracles.NotApplicable as e:  # capture refuses the step now: every call is traced, as lazy mode
        print(f"reason: {e}")
        print("the captured step is traced on every call")
        return
    verdict = oracles.judge(OP, cap, got, cap_args, cap_kwargs, got_args, got_kwargs)
    if not verdict:
        oracles.show(cap, got)
    assert verdict, f"the captured step disagrees with lazy mode: {verdict.message}"
    print("the captured step agrees with lazy mode")
''',
    "grad_vs_eager": '''
def main() -> None:
    op, args, kwargs = setup()
    want = oracles.grads(op, args, kwargs, "cpu", WEIGHT_SEED)    # eager autograd on CPU
    got = oracles.grads(op, args, kwargs, "mncore", WEIGHT_SEED)  # autograd through lazy mode
    verdict = compare(got, want, path="grad")
    assert verdict, f"mncore gradients disagree with eager: {verdict.message}"
    print("mncore gradients agree with eager")
''',
}

_ISOLATED = '''
TIMEOUT_S = {timeout!r}
MALLOC_CHECK = {malloc_check!r}  # the campaign ran under glibc's checking allocator: so does the child


def child() -> None:
    """The step that {kind}ed in the fuzz worker ({oracle})."""
    op, args, kwargs = setup()
{step}    print("REPRO-COMPLETED", flush=True)


def main() -> None:
    if "--child" in sys.argv:
        return child()
    cmd = [sys.executable, __file__, "--child", *sys.argv[1:]]
    env = {{**os.environ, **heap_check.environment()}} if MALLOC_CHECK else None
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, env=env)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"hang: mncore gave no result within {{TIMEOUT_S}} s") from None
    if proc.returncode != 0 or "REPRO-COMPLETED" not in proc.stdout:
        raise AssertionError(f"crash: the child exited with code {{proc.returncode}} before finishing\\n"
                             f"{{proc.stderr[-3000:]}}")
    print("mncore completed the step")
'''
_STEPS = {
    "context_vs_lazy": """    from mncore.context import Context, MNDevice

    context = Context(MNDevice(BACKEND))
    Context.switch_context(context)
    with tempfile.TemporaryDirectory() as codegen_dir:
        oracles.context_call(op, args, kwargs, context, codegen_dir)
""",
    "captured_vs_lazy": """    try:
        oracles.captured_call(op, args, kwargs, WEIGHT_SEED)
    except oracles.NotApplicable as e:  # capture refuses the step now: traced on every call
        print(f"the captured step is traced on every call: {e}")
""",
    "grad_vs_eager": """    oracles.grads(op, args, kwargs, "mncore", WEIGHT_SEED)
""",
    "lazy_vs_eager": """    oracles.lazy_call(op, args, kwargs)
""",
}
_SURVIVED = """    except Exception as e:  # a clear error is fine: eager's kernel crashes on these inputs
        print(f"mncore raised {type(e).__name__}: {e}")
"""
# mncore alone where eager's kernel died (lazy_alone, grad_alone): the same step; an exception survives it
_STEPS["lazy_alone"] = "    try:\n        oracles.lazy_call(op, args, kwargs)\n" + _SURVIVED
_STEPS["grad_alone"] = '    try:\n        oracles.grads(op, args, kwargs, "mncore", WEIGHT_SEED)\n' + _SURVIVED

_FOOTER = '''

if __name__ == "__main__":
    main()
'''


def render_repro(sig: str, original: Case, shrunk: Case, result: dict, meta: dict) -> str:
    """The text of a standalone repro script for ``shrunk``."""
    kind, oracle = result["kind"], result["oracle"]
    stem = file_stem(sig)
    message = textwrap.shorten(" ".join(str(result.get("message", "")).split()), 400)
    message = message.replace("\\", "/").replace(3 * '"', 3 * "'")  # it goes into a docstring
    header = _HEADER.format(
        sig=sig, stem=stem, description=textwrap.fill(shrunk.describe(), 100, subsequent_indent="  "),
        message=message, command=meta["command"], index=original.index, numel_before=original.numel(),
        numel_after=shrunk.numel(), mutations=", ".join(mutation_label(m) for m in shrunk.mutations) or "none",
        plugin_text=meta.get("plugin") or "(none)", root=str(REPO_ROOT), op=shrunk.op, backend=meta["backend"],
        plugin=meta.get("plugin"), weight_seed=shrunk.value_seed)
    if kind in ("crash", "oom", "hang"):
        # the child imports torch and mncore (seconds) before it runs the step
        body = _ISOLATED.format(timeout=meta["case_timeout"] + 30, kind=kind, oracle=oracle,
                                malloc_check=bool(meta.get("malloc_check")),
                                step=_STEPS.get(oracle, _STEPS["lazy_vs_eager"]))
    elif kind == "accepts_invalid":
        body = _BODIES["accepts_invalid"]
    else:
        body = _BODIES[oracle]
    return header + body + _FOOTER


class Findings:
    """The findings directory of one campaign (a resumed campaign keeps its earlier findings)."""

    def __init__(self, out: Path):
        self.dir = Path(out) / "findings"
        self.dir.mkdir(parents=True, exist_ok=True)

    def write(self, sig: str, original: Case, shrunk: Case, result: dict, shrink_info: dict, meta: dict) -> Path:
        """Write ``<stem>.pt``, ``<stem>.json`` and ``<stem>.py``; returns the script's path."""
        stem = file_stem(sig)
        args, kwargs = shrunk.build_inputs()
        torch.save({"args": args, "kwargs": kwargs}, self.dir / f"{stem}.pt")
        record: dict[str, Any] = {
            "signature": sig, "op": shrunk.op, "kind": result["kind"], "oracle": result["oracle"],
            "category": result.get("category"), "message": result.get("message", ""),
            "description": shrunk.describe(), "original_case": original.to_json(), "shrunk_case": shrunk.to_json(),
            "shrink": shrink_info, **meta,
        }
        (self.dir / f"{stem}.json").write_text(json.dumps(record, indent=2, default=str))
        script = self.dir / f"{stem}.py"
        script.write_text(render_repro(sig, original, shrunk, result, meta))
        return script
