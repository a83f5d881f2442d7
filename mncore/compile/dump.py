"""``mncore-dump DIR``: print a codegen directory's manifest in the style of MLSDK's ``dump_gpfnapp``."""
from __future__ import annotations

import argparse
import json
import pathlib
import sys

from mncore.compile.codegen import MANIFEST

_DTYPES = {"float32": "Float", "float64": "Double", "float16": "Half", "bfloat16": "BFloat16", "int64": "Long",
           "int32": "Int", "int16": "Short", "int8": "Char", "uint8": "Byte", "bool": "Bool"}


def _io_line(io: dict) -> str:
    dt = _DTYPES.get(io["dtype"], io["dtype"])
    shape = ",".join(str(s) for s in io["shape"])
    strides = ",".join(str(s) for s in io["layout"]["strides"])
    dirty = " Dirty" if io.get("dirty") else ""
    return (f"  {io['name']}: {io['dram']}/{dt}({shape} {io['layout']['kind']}{{strides=({strides})}}){dirty} "
            f"alias_base=null torch_dtype={dt} layout_kind=MNCore")


def render(man: dict, kernels: bool = True) -> str:
    """The manifest as text: inputs, outputs, kernel summary and memory plan."""
    if man.get("graph") is None:
        return "no graph (the function only returns its inputs or registered tensors)\n"
    st = man["stats"]
    lines = [f"graph {man['graph']} on {man['device']} precision={man['precision_policy']} "
             f"mncore {man['versions']['mncore']} compiler {man['versions']['compiler']} torch {man['versions']['torch']}",
             "inputs:"]
    lines += [_io_line(io) for io in man["inputs"]]
    lines.append("outputs:")
    lines += [_io_line(io) for io in man["outputs"]]
    kinds = ", ".join(f"{k} {n}" for k, n in st["kernels_by_kind"].items() if n)
    lines.append(f"kernels: {st['kernels']} ({kinds}); {st['flops']:,} FLOPs, {st['bytes']:,} bytes moved, "
                 f"modelled {st['modelled_s'] * 1e6:,.1f} us per call (modelled device time)")
    if kernels:
        for k in man["kernels"]:
            lines.append(f"  #{k['kernel']:<4} {k['kind']:<11} {k['format']:<6} {k['flops']:>16,} FLOP "
                         f"{k['bytes']:>14,} B {k['modelled_s'] * 1e6:>10.2f} us {k['bound']:<7} {', '.join(k['ops'])}")
    plan = man["memory_plan"]
    lines.append(f"memory plan: peak {plan['peak_bytes']:,} bytes (live peak {plan['live_peak_bytes']:,}), "
                 f"{len(plan['values'])} values, alignment {plan['alignment']} B")
    passes = {k: st[k] for k in ("cse_eliminated", "constants_deduplicated", "dce_eliminated") if k in st}
    lines.append("passes: " + ", ".join(f"{k}={v}" for k, v in passes.items())
                 + (f"; compile {st['compile_s'] * 1e3:.1f} ms" if "compile_s" in st else ""))
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="mncore-dump", description=__doc__)
    ap.add_argument("dir", type=pathlib.Path, help="a codegen directory (holds manifest.json)")
    ap.add_argument("--no-kernels", action="store_true", help="omit the per-kernel lines")
    args = ap.parse_args(argv)
    path = args.dir / MANIFEST
    try:
        man = json.loads(path.read_text())
    except FileNotFoundError:
        print(f"mncore-dump: {path} does not exist (is {args.dir} a codegen directory?)", file=sys.stderr)
        return 2
    except json.JSONDecodeError as e:
        print(f"mncore-dump: {path} is not valid JSON: {e}", file=sys.stderr)
        return 2
    sys.stdout.write(render(man, kernels=not args.no_kernels))
    return 0


if __name__ == "__main__":
    sys.exit(main())
