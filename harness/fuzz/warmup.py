"""Imported by the fuzz fork server only: pays PyTorch's first-use costs once, before workers fork.

The first meta-tensor op imports ~800 modules (sympy, torch._decomp, ...: about 2 s here), and
mncore's tracer and the oracles run meta ops. Without this every fresh worker would pay it in its
first case, which reads as a hang under short per-case timeouts. Only single-threaded work happens
here (meta tensors: no CPU kernels, no OpenMP pool, no mncore initialisation), so forking stays safe.
"""
import torch

torch.ops.aten.add.Tensor(torch.empty(2, device="meta"), torch.empty(2, device="meta"))
