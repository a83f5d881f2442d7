"""Job submission: one worker thread and queue, the three execution modes, errors naming graph and op."""
from mncore.execute.executor import Job, executor

__all__ = ["Job", "executor"]
