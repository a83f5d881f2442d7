"""Published figures of the torch_mncore article (PFN's blog post introducing torch_mncore's lazy mode and
its comparison with the MLSDK Context API), for reference lines in tables and plots.

The article is in Japanese; the page and the plots show an English translation only (a page or a plot
without a CJK font would show the original as empty boxes). It gives no per-width table for the MLP
sweep, only the two sentences translated below, so the small-width point has no stated width. Its
figures are for the default workloads (the MLP at batch 64, ResNet-18 at batch 32, GPT-2 small), so
reports of other configurations do not compare with them (``comparable``).
"""
from __future__ import annotations

SOURCE = "the torch_mncore article"

# Evaluation i (MLP, 4 layers of width w + ReLU, batch 64, MN-Core backend, lazy vs Context API step time).
# Original: "w が小さいときは trace が律速となり，Context API の約5倍の時間がかかっています。…
#            w=4096 では1.10倍と，ほぼ同等になりました。"
MLP_SMALL_W_RATIO = 5.0  # "about 5x" at small w; the width is not stated
MLP_W4096_RATIO = 1.10
MLP_QUOTE = ("“when w is small, the trace is the bottleneck and a step takes about 5 times as long as with the "
             "Context API … at w=4096 it is 1.10 times, nearly the same” (translated from Japanese)")

# Evaluation ii: ResNet-18 training, batch 32: "Context API の1.05倍" (1.05 times the Context API).
RESNET18_RATIO = 1.05

# Trace/device overlap, GPT-2 small training on the CUDA backend (a table in the article: mode, step
# time, GPU idle time, GPU utilisation).
ASYNC = {
    "sync": {"step_ms": 639, "idle_ms": 166, "util": 0.74},
    "async_naive": {"step_ms": 599, "idle_ms": 123, "util": 0.79},
    "async": {"step_ms": 563, "idle_ms": 86, "util": 0.85},
}
# "trace ... about 60 ms in synchronous execution" and, with GIL contention in the naive async mode,
# "from 60 ms to 145 ms".
ASYNC_TRACE_MS = {"sync": 60, "async_naive": 145}

MODE_NAMES = {"sync": "sync", "async_naive": "async naive", "async": "async (optimized)"}


def comparable(config: str | None) -> bool:
    """Whether a report of zoo config ``config`` measured the article's workloads (the default configs)."""
    return (config or "default") == "default"
