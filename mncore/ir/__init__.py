"""The tracing IR: tensor metadata, graph values, graph targets and per-op facts (no tracer state)."""
