"""Published figures of seed 000 (the torch_mncore blog post), for reference lines in tables and plots.

Source: ``shared/seeds/000_1b2fd7b3f53e2c3b.txt`` (Japanese). The post gives no per-width table for the
MLP sweep, only the two sentences quoted below, so the small-width point has no stated width.
"""
from __future__ import annotations

SEED = "seed 000 (torch_mncore blog post)"

# 評価 i (MLP, 4 layers of width w + ReLU, batch 64, MN-Core backend, lazy vs Context API step time):
# "w が小さいときは trace が律速となり，Context API の約5倍の時間がかかっています。…
#  w=4096 では1.10倍と，ほぼ同等になりました。"
MLP_SMALL_W_RATIO = 5.0  # "about 5x" at small w; the width is not stated
MLP_W4096_RATIO = 1.10
MLP_QUOTE = ("w が小さいときは trace が律速となり，Context API の約5倍 … w=4096 では1.10倍 "
             "(small w: about 5x the Context API; w=4096: 1.10x)")

# 評価 ii: ResNet-18 training, batch 32: "Context API の1.05倍".
RESNET18_RATIO = 1.05

# 3. trace/device overlap, GPT-2 small training on the CUDA backend (table in the post):
# 方式 / 1ステップの時間 / GPU のアイドル時間 / GPU 利用率
ASYNC = {
    "sync": {"step_ms": 639, "idle_ms": 166, "util": 0.74},
    "async_naive": {"step_ms": 599, "idle_ms": 123, "util": 0.79},
    "async": {"step_ms": 563, "idle_ms": 86, "util": 0.85},
}
# "trace ... 同期実行で約 60 ms" and, with GIL contention in the naive async mode, "60 ms から 145 ms".
ASYNC_TRACE_MS = {"sync": 60, "async_naive": 145}

MODE_NAMES = {"sync": "sync", "async_naive": "async naive", "async": "async (optimized)"}
