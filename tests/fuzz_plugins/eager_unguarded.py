"""The fuzzer's own list of inputs eager's kernels cannot run safely, emptied: such a case then reaches
eager's kernel and takes the worker down, as a case no rule knows yet does."""
from __future__ import annotations

from harness.fuzz import oracles

oracles.unsafe_for_eager = lambda op, args: ""
