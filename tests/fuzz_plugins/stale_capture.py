"""A step-capture bug for tests: a replay reads the arguments of the last recording, not the ones it is
called with (the classic capture bug: inputs baked in when recorded). The recording keeps those values
alive; the replay binds them in place of the call's own."""
from __future__ import annotations

import importlib
import types

from mncore.trace.tensor import LazyTensor

api = importlib.import_module("mncore.capture.api")  # mncore.capture is the function, not the package
replay = importlib.import_module("mncore.capture.replay")
_record, _program = api.record, replay.Program.__init__


def _recording_inputs_kept(fn, args, kwargs, leaves, world, previous):  # noqa: ANN001, ANN202
    out, plan = _record(fn, args, kwargs, leaves, world, previous)
    plan.stale = {k: types.SimpleNamespace(value=leaves[b[1]].mn_storage.value) for k, b in enumerate(plan.bindings)
                  if b[0] == "arg" and isinstance(leaves[b[1]], LazyTensor)}
    return out, plan


def _bound_to_recording(self, plan) -> None:  # noqa: ANN001
    _program(self, plan)
    for k, holder in getattr(plan, "stale", {}).items():
        self.reads[k] = lambda h=holder: h


api.record = _recording_inputs_kept
replay.Program.__init__ = _bound_to_recording
