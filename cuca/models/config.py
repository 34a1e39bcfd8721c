"""Typed, range-checked reads of a model's hyperparameters from GGUF metadata (the file is untrusted).

Every architecture's `Config.from_gguf` reads its keys through `req` / `opt` / `req_list`, so a wrong type, a
non-finite or out-of-range number, or a layer count the file's tensors cannot back is a GGUFError naming the file
and the key at load time, never a ValueError/ZeroDivisionError there or a kernel error at the first request.
"""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType

from ..errors import GGUFError
from ..gguf import GGUFFile

INT32_MAX = 2**31 - 1  # kernels take positions, windows and dimensions as C ints
DIM_MAX = 1 << 24  # widths, head counts and dims: far above any real model, far below an overflow
F32_MAX = float(np.finfo(np.float32).max)  # kernels take float32: anything larger becomes inf
F32_TINY = float(np.finfo(np.float32).tiny)  # the smallest float32 > 0 that is not denormal: "positive"
_BLK = re.compile(r"blk\.(\d+)\.")
_MISSING = object()


def _show(v: Any) -> str:
    s = repr(v)
    return s if len(s) <= 60 else s[:57] + "..."


def check(f: GGUFFile, key: str, v: Any, kind: type, lo: float | None = None, hi: float | None = None) -> Any:
    """`v` (the value of `key`) as `kind` (int, float, bool or str), within [lo, hi] for numbers."""
    where = f"{f.path}: metadata key {key!r}"
    if kind is int:
        if type(v) is not int:  # bool is not an integer here, nor a float holding one
            raise GGUFError(f"{where} must be an integer, got {_show(v)}")
    elif kind is float:
        if type(v) not in (int, float):
            raise GGUFError(f"{where} must be a number, got {_show(v)}")
        v = float(v)
        if not math.isfinite(v):
            raise GGUFError(f"{where} must be finite, got {v}")
    elif kind is bool:
        if type(v) is not bool and not (type(v) is int and v in (0, 1)):
            raise GGUFError(f"{where} must be a boolean, got {_show(v)}")
        return bool(v)
    elif kind is str:
        if type(v) is not str:
            raise GGUFError(f"{where} must be a string, got {_show(v)}")
        return v
    else:
        raise TypeError(f"unsupported kind {kind!r}")
    if lo is not None and v < lo:
        raise GGUFError(f"{where} must be >= {lo:g}, got {v:g}")
    if hi is not None and v > hi:
        raise GGUFError(f"{where} must be <= {hi:g}, got {v:g}")
    return v


def req(f: GGUFFile, suffix: str, kind: type, lo: float | None = None, hi: float | None = None) -> Any:
    """The required key `{arch}.{suffix}`, typed and range-checked (GGUFError naming the file and key)."""
    key = f.arch_key(suffix)
    return check(f, key, f.require(key), kind, lo, hi)


def opt(f: GGUFFile, suffix: str, kind: type, default: Any, lo: float | None = None,
        hi: float | None = None) -> Any:
    """The optional key `{arch}.{suffix}` (checked when present), else `default` (trusted, unchecked)."""
    key = f.arch_key(suffix)
    v = f.get(key, _MISSING)
    return default if v is _MISSING else check(f, key, v, kind, lo, hi)


def items(f: GGUFFile, suffix: str, v: Any, kind: type, n: int, bounds: tuple[float | None, float | None]) -> tuple:
    """An array value of `{arch}.{suffix}` with exactly `n` items, each checked as `check` does."""
    key = f.arch_key(suffix)
    if not isinstance(v, list):
        raise GGUFError(f"{f.path}: metadata key {key!r} must be an array, got {_show(v)}")
    if len(v) != n:
        raise GGUFError(f"{f.path}: metadata key {key!r} has {len(v)} entries for {n} layers")
    return tuple(check(f, f"{key}[{i}]", x, kind, *bounds) for i, x in enumerate(v))


def per_layer(f: GGUFFile, suffix: str, n_layer: int, kind: type, bounds: tuple[float | None, float | None],
              default: Any = _MISSING) -> tuple:
    """A key holding one value for every layer or an array of one value per layer (required unless `default`)."""
    key = f.arch_key(suffix)
    v = f.require(key) if default is _MISSING else f.get(key, default)
    if isinstance(v, list):
        return items(f, suffix, v, kind, n_layer, bounds)
    return (check(f, key, v, kind, *bounds),) * n_layer


def blocks_present(f: GGUFFile) -> int:
    """How many distinct `blk.N.` indices the file has tensors for: what any layer count is bounded by."""
    return len({m[1] for name in f.tensors if (m := _BLK.match(name))})


def layer_count(f: GGUFFile, suffix: str = "block_count", lo: int = 1) -> int:
    """`{arch}.{suffix}`, at least `lo` and at most the number of blocks the tensors hold (so a hostile count
    fails here, before any per-layer loop)."""
    return int(req(f, suffix, int, lo, min(blocks_present(f), INT32_MAX)))


def rope_dims(f: GGUFFile, suffix: str, head_dim: int) -> int:
    """`{arch}.{suffix}` (rotated dims per head): even and at most the head dim; the head dim when absent."""
    n = int(opt(f, suffix, int, head_dim, 0, head_dim))
    if n % 2:
        raise GGUFError(f"{f.path}: metadata key {f.arch_key(suffix)!r} must be even, got {n}")
    return n


def rope_base(f: GGUFFile, suffix: str, default: float) -> float:
    return float(opt(f, suffix, float, default, F32_TINY, F32_MAX))


def rope_scale(f: GGUFFile) -> float:
    """1 / `rope.scaling.factor` (absent or 0: no scaling)."""
    factor = float(opt(f, "rope.scaling.factor", float, 0.0, 0.0, F32_MAX))
    return 1.0 / factor if factor >= F32_TINY else 1.0


def eps(f: GGUFFile) -> float:
    return float(req(f, "attention.layer_norm_rms_epsilon", float, F32_TINY, 1.0))


def head_counts(f: GGUFFile, n_head: int, n_head_kv: int, what: str = "") -> None:
    """Grouped-query attention needs the query heads to be a multiple of the K/V heads."""
    if n_head % n_head_kv:
        raise GGUFError(f"{f.path}: {what}attention.head_count {n_head} is not a multiple of "
                        f"attention.head_count_kv {n_head_kv}")


def dim(f: GGUFFile, suffix: str, default: Any = _MISSING, lo: int = 1) -> int:
    """A width, head count or head dim: an integer in [lo, DIM_MAX] (required unless `default`)."""
    if default is _MISSING:
        return int(req(f, suffix, int, lo, DIM_MAX))
    return int(opt(f, suffix, int, default, lo, DIM_MAX))


def context_length(f: GGUFFile) -> int:
    return int(req(f, "context_length", int, 1, INT32_MAX))


def float_weight(f: GGUFFile, name: str, shape: tuple[int, ...]) -> np.ndarray:
    """A small F32/F16 weight of `shape` (norms, conv taps), as contiguous float32; a block or integer type
    (whose view holds raw bytes) is a GGUFError naming the tensor."""
    t = f.tensor(name, shape)
    if t.ggml_type not in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
        raise GGUFError(f"{f.path}: tensor {name!r} is stored as {t.type_name}; it must be F32 or F16")
    return np.ascontiguousarray(np.asarray(t.data, dtype=np.float32))
