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
    """Persistent compile cache settings; the directory is used by the compiler's disk cache."""

    path: pathlib.Path
    enable_app_cache: bool = True
    enable_onnx_cache: bool = True
    enable_codegen_cache: bool = True
    enable_gpfn2obj_cache: bool = True

    def __init__(self, path: str | os.PathLike, enable_app_cache: bool = True, enable_onnx_cache: bool = True,
                 enable_codegen_cache: bool = True, enable_gpfn2obj_cache: bool = True):
        object.__setattr__(self, "path", pathlib.Path(path))
        object.__setattr__(self, "enable_app_cache", enable_app_cache)
        object.__setattr__(self, "enable_onnx_cache", enable_onnx_cache)
        object.__setattr__(self, "enable_codegen_cache", enable_codegen_cache)
        object.__setattr__(self, "enable_gpfn2obj_cache", enable_gpfn2obj_cache)
