"""Runtime: buffer table, executor (worker thread and jobs), metrics and timeline."""
