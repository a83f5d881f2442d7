"""The harness: the ``harness`` command, runners, comparisons and op-test input generation."""
