"""Compiler: lowering traced graphs to executables, and the compile cache."""
from mncore.compiler.lowering import register_lowering, unregister_lowering

__all__ = ["register_lowering", "unregister_lowering"]
