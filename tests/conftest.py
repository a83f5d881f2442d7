"""Shared fixtures: every test process initialises mncore on pfvm:cpu; tiers are markers."""
from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import contextlib  # noqa: E402

import pytest  # noqa: E402

import mncore  # noqa: E402
from mncore.context import Context, MNDevice  # noqa: E402

# Settings the simulator tests must not inherit from the environment they run in: every knob.
SIM_ENV_VARS = tuple(k.env for k in mncore.config.KNOBS if k.read != "test collection")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Unmarked tests belong to the fast ``unit`` tier."""
    for item in items:
        if not any(item.get_closest_marker(m) for m in ("unit", "models", "full", "opinfo")):
            item.add_marker(pytest.mark.unit)


@pytest.fixture(autouse=True)
def _mncore_cpu():
    """A known runtime state per test: pfvm:cpu, default async execution, warnings on."""
    mncore.init_cpu(implicit_sync="warn", execution="async")
    yield
    mncore.wait_device_ops()


def back_to_cpu() -> None:
    """Drain the worker (a failed job's error must not leak into the next test) and re-init pfvm:cpu."""
    if Context._current is not None and Context._current.device.name != "pfvm:cpu":
        with contextlib.suppress(Exception):
            Context.switch_context(Context(MNDevice("pfvm:cpu")))
    for _ in range(3):  # init syncs what is pending: a failing graph raises once, then the switch goes through
        try:
            mncore.init_cpu(implicit_sync="warn", execution="async")
            return
        except Exception:  # noqa: BLE001 - the test that left it has already reported it
            pass
    mncore.init_cpu(implicit_sync="warn", execution="async")


@pytest.fixture
def sim_env(monkeypatch, tmp_path):
    """Isolated simulator environment (own board lock directory); pfvm:cpu again afterwards."""
    for var in SIM_ENV_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("MNCORE_RUNTIME_DIR", str(tmp_path / "runtime"))
    yield monkeypatch
    back_to_cpu()


@pytest.fixture
def no_capture_check(monkeypatch):
    """Capture tests count replays: an inherited MNCORE_CAPTURE_CHECK must not add re-validations."""
    monkeypatch.delenv("MNCORE_CAPTURE_CHECK", raising=False)
    yield
