"""``storage.path`` and ``CacheOptions``: where compile outputs and caches live."""
from __future__ import annotations

import os
import pathlib
from dataclasses import dataclass


def path(target: str | os.PathLike) -> pathlib.Path:
    """MLSDK's ``storage.path``: a ``pathlib.Path`` (supports ``/`` joins)."""
    return pathlib.Path(target)


@dataclass(frozen=True)
class CacheOptions:
    """Persistent compile cache: the compiler's disk cache directory (``read_only`` for shared caches).

    The ``enable_*`` flags are MLSDK's names for its artifact kinds; they are accepted so that MLSDK
    programs run unchanged, and the one disk cache here holds the whole executable.
    """

    path: pathlib.Path
    enable_app_cache: bool = True
    enable_onnx_cache: bool = True
    enable_codegen_cache: bool = True
    enable_gpfn2obj_cache: bool = True
    read_only: bool = False

    def __init__(self, path: str | os.PathLike, enable_app_cache: bool = True, enable_onnx_cache: bool = True,
                 enable_codegen_cache: bool = True, enable_gpfn2obj_cache: bool = True, read_only: bool = False):
        object.__setattr__(self, "path", pathlib.Path(path))
        object.__setattr__(self, "enable_app_cache", enable_app_cache)
        object.__setattr__(self, "enable_onnx_cache", enable_onnx_cache)
        object.__setattr__(self, "enable_codegen_cache", enable_codegen_cache)
        object.__setattr__(self, "enable_gpfn2obj_cache", enable_gpfn2obj_cache)
        object.__setattr__(self, "read_only", read_only)
