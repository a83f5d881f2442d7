"""``torch.mncore``: the device module PyTorch expects of a backend, and ``torch.load`` onto the device.

PyTorch reaches a backend through its device module: ``torch.manual_seed`` calls
``manual_seed_all``, ``torch.random.fork_rng(device_type='mncore')`` saves and restores
``get_rng_state``/``set_rng_state``, ``torch.autocast('mncore')`` asks ``get_amp_supported_dtype``,
``torch.load`` checks ``is_available``/``device_count``. There is one ``mncore`` device (index 0);
the execution device behind it is chosen with ``mncore.init``.

``torch.load(f, map_location='mncore')``: lazy tensors have no storage for PyTorch to restore into,
so the storages load on the host and each tensor rebuilt from one is uploaded as a new device
tensor (tensors that shared a storage in the file become separate device tensors).
"""
from __future__ import annotations

import random
from typing import Any

import torch

from mncore.config import settings
from mncore.trace import rng
from mncore.trace.dispatch import device_arg
from mncore.trace.sync import wait_device_ops
from mncore.trace.tensor import DEVICE_NAME, device

_STATE_BYTES = 16  # the stream's (seed, offset), two little-endian 64-bit words


def _check_index(index: Any) -> None:
    if index is not None:
        device_arg(index if isinstance(index, (str, torch.device)) else torch.device(DEVICE_NAME, int(index)))


class DeviceModule:
    """What ``torch.mncore`` exposes (registered by ``torch._register_device_module``)."""

    @staticmethod
    def is_available() -> bool:
        return True

    @staticmethod
    def is_initialized() -> bool:
        return True

    @staticmethod
    def device_count() -> int:
        return 1

    @staticmethod
    def current_device() -> int:
        return 0

    @staticmethod
    def set_device(index: Any) -> None:
        _check_index(index)

    @staticmethod
    def _is_in_bad_fork() -> bool:
        return False

    @staticmethod
    def synchronize(device: Any = None) -> None:
        """Block until every submitted graph has finished (``mncore.wait_device_ops``)."""
        _check_index(device)
        wait_device_ops()

    # random state: the counter-based stream of trace/rng.py
    @staticmethod
    def manual_seed(seed: int) -> None:
        rng.manual_seed(seed)

    @staticmethod
    def manual_seed_all(seed: int) -> None:
        rng.manual_seed(seed)

    @staticmethod
    def seed() -> None:
        """Seed the stream with a non-deterministic number (as ``torch.cuda.seed``)."""
        rng.manual_seed(random.SystemRandom().getrandbits(64))

    @staticmethod
    def seed_all() -> None:
        DeviceModule.seed()

    @staticmethod
    def initial_seed() -> int:
        """The seed the stream started from (the last ``manual_seed``)."""
        return rng.get_state()[0]

    @staticmethod
    def get_rng_state(device: Any = "mncore") -> torch.Tensor:
        """A uint8 tensor on the CPU, as CUDA's: the stream's seed and offset."""
        _check_index(device)
        seed, offset = rng.get_state()
        raw = seed.to_bytes(8, "little") + offset.to_bytes(8, "little")
        return torch.frombuffer(bytearray(raw), dtype=torch.uint8)

    @staticmethod
    def set_rng_state(new_state: torch.Tensor, device: Any = "mncore") -> None:
        _check_index(device)
        if not isinstance(new_state, torch.Tensor) or new_state.dtype != torch.uint8 or \
                new_state.numel() != _STATE_BYTES:
            raise ValueError(f"torch.mncore.set_rng_state expects the uint8 tensor of {_STATE_BYTES} bytes that "
                             "torch.mncore.get_rng_state() returns")
        raw = bytes(new_state.cpu().tolist())
        rng.set_state((int.from_bytes(raw[:8], "little"), int.from_bytes(raw[8:], "little")))

    @staticmethod
    def get_rng_state_all() -> list[torch.Tensor]:
        return [DeviceModule.get_rng_state()]

    @staticmethod
    def set_rng_state_all(new_states: list[torch.Tensor]) -> None:
        DeviceModule.set_rng_state(new_states[0])

    # mixed precision
    @staticmethod
    def get_amp_supported_dtype() -> list[torch.dtype]:
        """``torch.autocast('mncore', dtype=...)``: the lower-precision dtypes graphs can compute in."""
        return [torch.float16, torch.bfloat16]

    @staticmethod
    def is_bf16_supported(including_emulation: bool = True) -> bool:
        """bfloat16 graphs run on every device; natively only where PyTorch's own kernels run them
        (pfvm): MN-Core 2's formats are double, float, pseudo-single and its 1-6-9 half."""
        return including_emulation or not settings.simulated


def _is_mncore(location: str) -> bool:
    return location == DEVICE_NAME or location.startswith(DEVICE_NAME + ":")


def _restore_on_host(obj: Any, location: str) -> Any:
    """``torch.load(map_location='mncore')``: keep the storage on the host, marked for upload."""
    if not _is_mncore(location):
        return None
    device_arg(location)
    obj._mncore_upload = True
    return obj


def _upload_rebuilt(rebuild: Any) -> Any:
    """Wrap ``torch._utils._rebuild_tensor``: a tensor rebuilt from a marked storage goes to the device."""
    def rebuild_tensor(storage: Any, storage_offset: int, size: Any, stride: Any) -> torch.Tensor:
        t = rebuild(storage, storage_offset, size, stride)
        if getattr(storage._untyped_storage, "_mncore_upload", False):
            return t.to(device())
        return t
    return rebuild_tensor


def register_loading() -> None:
    """Make ``torch.load(map_location='mncore' | 'mncore:0' | torch.device('mncore'))`` load onto the device."""
    torch.serialization.register_package(15, lambda obj: None, _restore_on_host)
    torch._utils._rebuild_tensor = _upload_rebuilt(torch._utils._rebuild_tensor)
