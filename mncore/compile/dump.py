"""``mncore-dump DIR``: print a codegen directory's manifest in the style of MLSDK's ``dump_gpfnapp``."""
from __future__ import annotations

import argparse
import json
import pathlib
import sys
import textwrap

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


MAKERS = ("a codegen directory is written by Context.compile(fn, inputs, codegen_dir) (e.g. "
          "`python examples/context/add.py` writes /tmp/add_two_tensors) and, in lazy mode, one per graph under "
          "MNCORE_CODEGEN_DIR (e.g. `MNCORE_CODEGEN_DIR=/tmp/cg python examples/lazy_mlp.py`, then "
          "`mncore-dump /tmp/cg/<graph>`)")
EPILOG = "example:\n  python examples/context/add.py && mncore-dump /tmp/add_two_tensors\n\n" + textwrap.fill(
    f"A codegen directory holds {MANIFEST}, graph.py and program.txt; {MAKERS}.", 100)


def _missing(d: pathlib.Path) -> str:
    """Why ``d`` is not a codegen directory, and what makes one (or which of its subdirectories are)."""
    if not d.exists():
        return f"{d} does not exist: {MAKERS}"
    if not d.is_dir():
        return f"{d} is a file, not a codegen directory: {MAKERS}"
    inner = sorted(p.parent for p in d.glob(f"*/{MANIFEST}"))
    if inner:
        shown = ", ".join(str(p) for p in inner[:5]) + (f" and {len(inner) - 5} more" if len(inner) > 5 else "")
        return (f"{d} holds no {MANIFEST} but {len(inner)} codegen director{'y' if len(inner) == 1 else 'ies'} "
                f"(lazy mode writes one per graph): {shown}; give one of them")
    return f"{d} holds no {MANIFEST} (not a codegen directory): {MAKERS}"


def main(argv: list[str] | None = None) -> int:
    from mncore._version import __version__

    ap = argparse.ArgumentParser(prog="mncore-dump", description=__doc__, epilog=EPILOG,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir", type=pathlib.Path, help="a codegen directory (holds manifest.json)")
    ap.add_argument("--no-kernels", action="store_true", help="omit the per-kernel lines (default: print them)")
    ap.add_argument("--version", action="version", version=f"%(prog)s (mncore) {__version__}")
    args = ap.parse_args(argv)
    path = args.dir / MANIFEST
    if not path.is_file():
        print(f"mncore-dump: {_missing(args.dir)}", file=sys.stderr)
        return 2
    try:
        man = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        print(f"mncore-dump: {path} is not valid JSON: {e}", file=sys.stderr)
        return 2
    sys.stdout.write(render(man, kernels=not args.no_kernels))
    return 0


if __name__ == "__main__":
    sys.exit(main())
