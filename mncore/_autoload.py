"""torch's device-backend autoload entry point (``torch.backends`` group in pyproject.toml).

Importing this module imports the ``mncore`` package, which registers the device, so the device
exists before any autograd engine starts whatever the user imports first. When the user imported
``mncore`` first, torch reaches this while that import is still running; it finishes the
registration itself.
"""


def load() -> None:
    """Nothing left to do: importing this module has imported (or is importing) ``mncore``."""
