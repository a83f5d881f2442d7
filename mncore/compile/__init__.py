"""The compiler: a traced FX graph and options in, an ``Executable`` (data) out. Reads no global settings."""
from mncore.compile.lowering import register_lowering, unregister_lowering

__all__ = ["register_lowering", "unregister_lowering"]
