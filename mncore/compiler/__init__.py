"""Compiler: lowering traced graphs to executables, and the compile cache."""
