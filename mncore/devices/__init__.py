"""Execution devices behind the ``mncore`` torch device."""
