"""Shared fixtures: every test process initialises mncore on pfvm:cpu; tiers are markers."""
from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import pytest  # noqa: E402

import mncore  # noqa: E402


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Unmarked tests belong to the fast ``unit`` tier."""
    for item in items:
        if not any(item.get_closest_marker(m) for m in ("unit", "models", "full")):
            item.add_marker(pytest.mark.unit)


@pytest.fixture(autouse=True)
def _mncore_cpu():
    """A known runtime state per test: pfvm:cpu, default async execution, warnings on."""
    mncore.init_cpu(implicit_sync="warn", execution="async")
    yield
    mncore.wait_device_ops()
