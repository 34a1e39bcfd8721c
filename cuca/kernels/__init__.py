"""Kernel dispatch: the C extension when it is built, else the numpy twins in `_ref` (same names, same
signatures). `BACKEND` says which one is in use; tests run on both."""

from __future__ import annotations

import importlib
from types import ModuleType

from . import _ref

_c: ModuleType | None
try:
    _c = importlib.import_module(f"{__name__}._ckernels")
except ImportError:  # pragma: no cover - only when the extension was not built
    _c = None

BACKEND = "c" if _c is not None else "numpy"
ISA = getattr(_c, "ISA", "numpy")
impl: ModuleType = _c if _c is not None else _ref


def implementations() -> dict[str, ModuleType]:
    """Every available implementation by name: always "numpy", plus "c" when built."""
    out: dict[str, ModuleType] = {"numpy": _ref}
    if _c is not None:
        out["c"] = _c
    return out
