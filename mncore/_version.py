"""The one source of mncore's version (pyproject.toml reads it too)."""
__version__ = "0.3.0"
