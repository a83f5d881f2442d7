"""``MNCORE_DEBUG=recompile``: say what changed since the previous compile, and where it was traced."""
from __future__ import annotations

import sys

from mncore.graph.collect import Collected
from mncore.graph.key import GraphKey
from mncore.ir.values import describe_site

_last: list[tuple[GraphKey, list] | None] = [None]


def note_compile(name: str, g: Collected, key: GraphKey, explain: bool) -> None:
    """Remember every compiled graph; with ``explain``, print the first difference from the previous one."""
    prev = _last[0]
    _last[0] = (key, [n.sig for n in g.order])
    if prev is None or not explain:
        return
    prev_key, prev_sigs = prev
    items = key.items
    lines = [f"mncore[recompile]: compiling {name} ({len(items)} ops); previous graph had {len(prev_key.items)} ops"]
    for j, (a, b) in enumerate(zip(prev_key.items, items)):
        if a != b:
            old, new = prev_sigs[j].key, g.order[j].sig.key
            n = g.order[j]
            what = "op" if old[0] is not new[0] else ("input shapes/dtypes" if old[3] != new[3] else
                                                     "non-tensor arguments" if old[1:3] != new[1:3] else "wiring")
            lines.append(f"  first difference at op #{j}: {what} changed: was {old[0]} {old[1:]} now {new[0]} {new[1:]}")
            if n.frame:
                lines.append(f"  traced at {describe_site(n.frame)}")
            break
    else:
        if len(prev_key.items) != len(items):
            lines.append("  the graph is a prefix/extension of the previous one (op count changed)")
        elif prev_key.outputs != key.outputs:
            lines.append("  the set of output tensors changed (a different set of tensors is alive at sync)")
        else:
            lines.append(f"  {key.options} vs {prev_key.options}: compile options or device changed")
    print("\n".join(lines), file=sys.stderr)
