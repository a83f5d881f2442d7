"""``mncore.config``: the runtime settings chosen by ``mncore.init`` (read them with ``current()``)."""
from __future__ import annotations

from mncore.runtime.state import Settings, settings


def current() -> Settings:
    """The settings in force (device, kind, execution, sim_mode, float_dtype, ...); do not modify."""
    return settings
