"""Where in the user's program an op was traced: the first frame outside torch and mncore."""
from __future__ import annotations

import os
import sys
import warnings

import torch

from mncore.ir.values import Site

_LIBRARY_DIRS = tuple(os.path.dirname(m.__file__) + os.sep for m in (torch, sys.modules["mncore"]))


def user_site() -> Site | None:
    """(file, line, function) of the innermost user frame; None on a thread with no user frame
    (autograd's engine thread runs backward without one). Frames of code without a file (``<string>``:
    `python -c`, the REPL's ``<stdin>``, generated code) count only when no frame with a file does;
    the import machinery's ``<frozen ...>`` frames never."""
    f = sys._getframe(1)
    fileless = None
    while f is not None:
        name = f.f_code.co_filename
        if not name.startswith(_LIBRARY_DIRS):
            if not name.startswith("<"):
                return name, f.f_lineno, f.f_code.co_name
            if fileless is None and not name.startswith("<frozen"):
                fileless = name, f.f_lineno, f.f_code.co_name
        f = f.f_back
    return fileless



def warn_at(site: Site | None, message: str, category: type[Warning]) -> None:
    """A warning pointing at the user's line ``site``; without one (autograd's engine thread), at the
    caller of the function that warns."""
    if site is None:
        warnings.warn(message, category, stacklevel=3)
    else:
        warnings.warn_explicit(message, category, site[0], site[1])
