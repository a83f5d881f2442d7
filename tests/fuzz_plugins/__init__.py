"""Test backends for ``harness fuzz --plugin``: each module injects a known bug when imported."""
