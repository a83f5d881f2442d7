"""A grossly wrong lowering: ``aten.mul.Tensor`` computes ``a + b`` on the device."""
import torch

from mncore import register_lowering

register_lowering(torch.ops.aten.mul.Tensor, torch.ops.aten.add.Tensor)
