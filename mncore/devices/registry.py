"""The device registry: device strings are parsed by the registered kinds, in order.

Adding a device is one module with a ``Device`` subclass and one ``register`` line (the built-in
ones below; a plugin or a test calls ``mncore.register_device``). The registry also holds the
device the process is attached to.
"""
from __future__ import annotations

from mncore.devices.base import Device
from mncore.devices.emu2 import Emu2Device
from mncore.devices.mncore2 import MNCore2Device
from mncore.devices.pfvm import PfvmDevice

_kinds: list[type[Device]] = []
_active: list[Device | None] = [None]


def register(cls: type[Device]) -> type[Device]:
    """Make device strings of ``cls.kind`` parse to ``cls`` (idempotent; usable as a decorator)."""
    if not (isinstance(cls, type) and issubclass(cls, Device)) or not cls.kind:
        raise TypeError(f"register_device needs a Device subclass with a 'kind', got {cls!r}")
    if any(k.kind == cls.kind and k is not cls for k in _kinds):
        raise ValueError(f"a device kind {cls.kind!r} is already registered")
    if cls not in _kinds:
        _kinds.append(cls)
    return cls


def unregister(cls: type[Device]) -> None:
    if cls in _kinds:
        _kinds.remove(cls)


register(PfvmDevice)
register(Emu2Device)
register(MNCore2Device)


def available() -> list[str]:
    return [name for k in _kinds for name in k.available()]


def parse(spec: str) -> Device:
    """The (unattached) device ``spec`` names; ``ValueError`` listing the valid forms otherwise."""
    if not isinstance(spec, str):
        raise TypeError(f"device must be a string such as 'pfvm:cpu', got {type(spec).__name__}")
    s = spec.strip().lower()
    for kind in _kinds:
        try:
            dev = kind.parse(s)
        except ValueError as e:
            raise ValueError(f"{e}; available devices: {', '.join(available())}") from None
        if dev is not None:
            return dev
    forms = [f for k in _kinds for f in (k.forms or (k.kind,))]
    raise ValueError(f"unknown device {spec!r}; valid forms are {', '.join(forms)} "
                     f"(available now: {', '.join(available())})")


def active() -> Device | None:
    """The device ``mncore.init`` attached (None before the first ``init``)."""
    return _active[0]


def attach(dev: Device) -> Device:
    """Attach ``dev`` in place of the current device (which stays attached if this fails)."""
    _active[0] = dev.attach(_active[0])
    return _active[0]
