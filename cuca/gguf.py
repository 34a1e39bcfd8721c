"""GGUF reading: typed metadata and memory-mapped tensor views, with every offset bounds-checked.

The header is parsed here (the `gguf` package's reader walks 262k-entry vocabularies one numpy view at a time,
~8 s for Gemma 3), using the `gguf` package's enums and block sizes. Tensor data is never copied: each tensor is
a view into one read-only np.memmap. A truncated or hostile file raises GGUFError naming the file and the problem.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

from .errors import GGUFError, ProviderError

GGUF_MAGIC = b"GGUF"
_SCALARS: dict[int, tuple[str, int]] = {
    GGUFValueType.UINT8: ("<B", 1),
    GGUFValueType.INT8: ("<b", 1),
    GGUFValueType.UINT16: ("<H", 2),
    GGUFValueType.INT16: ("<h", 2),
    GGUFValueType.UINT32: ("<I", 4),
    GGUFValueType.INT32: ("<i", 4),
    GGUFValueType.FLOAT32: ("<f", 4),
    GGUFValueType.BOOL: ("<?", 1),
    GGUFValueType.UINT64: ("<Q", 8),
    GGUFValueType.INT64: ("<q", 8),
    GGUFValueType.FLOAT64: ("<d", 8),
}
_NP_SCALARS: dict[int, str] = {
    GGUFValueType.UINT8: "<u1",
    GGUFValueType.INT8: "<i1",
    GGUFValueType.UINT16: "<u2",
    GGUFValueType.INT16: "<i2",
    GGUFValueType.UINT32: "<u4",
    GGUFValueType.INT32: "<i4",
    GGUFValueType.FLOAT32: "<f4",
    GGUFValueType.BOOL: "?",
    GGUFValueType.UINT64: "<u8",
    GGUFValueType.INT64: "<i8",
    GGUFValueType.FLOAT64: "<f8",
}
_MAX_DIMS = 4
_MAX_NAME = 1 << 16
_MAX_ALIGN = 1 << 16  # far above any real file's (32); a larger pad only pushes the data past the file


@dataclass(frozen=True)
class TensorInfo:
    """One tensor: `shape` in numpy order (rows, cols), i.e. GGUF's ne reversed; `data` is the raw view."""

    name: str
    ggml_type: int
    shape: tuple[int, ...]
    data: np.ndarray

    @property
    def type_name(self) -> str:
        return GGMLQuantizationType(self.ggml_type).name

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)


class _Cursor:
    """Bounds-checked little-endian reader over the header bytes."""

    def __init__(self, buf: np.memmap, path: Path):
        self.buf, self.pos, self.path, self.size = buf, 0, path, len(buf)

    def fail(self, what: str) -> GGUFError:
        return GGUFError(f"{self.path}: {what} (at byte {self.pos} of {self.size})")

    def take(self, n: int, what: str) -> bytes:
        if n < 0 or self.pos + n > self.size:
            raise self.fail(f"truncated while reading {what}")
        out = self.buf[self.pos : self.pos + n].tobytes()
        self.pos += n
        return out

    def scalar(self, vtype: int, what: str) -> Any:
        fmt, n = _SCALARS[vtype]
        return struct.unpack(fmt, self.take(n, what))[0]

    def u32(self, what: str) -> int:
        return int(self.scalar(GGUFValueType.UINT32, what))

    def u64(self, what: str) -> int:
        return int(self.scalar(GGUFValueType.UINT64, what))

    def string(self, what: str) -> str:
        n = self.u64(f"length of {what}")
        raw = self.take(n, what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise self.fail(f"{what} is not valid UTF-8") from e

    def value(self, vtype: int, key: str) -> Any:
        if vtype == GGUFValueType.STRING:
            return self.string(f"value of {key!r}")
        if vtype in _SCALARS:
            v = self.scalar(vtype, f"value of {key!r}")
            return bool(v) if vtype == GGUFValueType.BOOL else v
        if vtype == GGUFValueType.ARRAY:
            sub = self.u32(f"array type of {key!r}")
            n = self.u64(f"array length of {key!r}")
            if sub in _NP_SCALARS:
                width = _SCALARS[sub][1]
                if n > (self.size - self.pos) // width:
                    raise self.fail(f"array {key!r} claims {n} items, more than the file holds")
                arr = np.frombuffer(self.take(n * width, f"array {key!r}"), dtype=_NP_SCALARS[sub])
                return arr.tolist()
            if sub == GGUFValueType.STRING:
                if n > (self.size - self.pos) // 8:
                    raise self.fail(f"array {key!r} claims {n} strings, more than the file holds")
                return [self.string(f"item {i} of {key!r}") for i in range(n)]
            raise self.fail(f"array {key!r} has unsupported item type {sub}")
        raise self.fail(f"key {key!r} has unknown value type {vtype}")


class GGUFFile:
    """A GGUF file: `metadata` (key -> Python value), `tensors` (name -> TensorInfo), `architecture`."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        try:
            self._mm = np.memmap(self.path, mode="r", dtype=np.uint8)
        except FileNotFoundError as e:
            raise GGUFError(f"{self.path}: no such file") from e
        except (OSError, ValueError) as e:  # empty file, directory, permissions
            raise GGUFError(f"{self.path}: cannot map the file ({e})") from e
        cur = _Cursor(self._mm, self.path)
        if cur.take(4, "magic") != GGUF_MAGIC:
            raise GGUFError(f"{self.path}: not a GGUF file (bad magic)")
        version = cur.u32("version")
        if version not in (2, 3):
            raise GGUFError(f"{self.path}: unsupported GGUF version {version}")
        n_tensors = cur.u64("tensor count")
        n_kv = cur.u64("metadata count")
        # every kv entry needs >= 13 bytes and every tensor entry >= 24: reject impossible counts before looping
        if n_kv * 13 + n_tensors * 24 > cur.size:
            raise GGUFError(f"{self.path}: header claims {n_kv} keys and {n_tensors} tensors, too many for the file")
        self.metadata: dict[str, Any] = {}
        for _ in range(n_kv):
            key = cur.string("metadata key")
            if key in self.metadata:  # the last one would win silently: a second block_count changes the model
                raise cur.fail(f"duplicate metadata key {key!r}")
            vtype = cur.u32(f"type of {key!r}")
            self.metadata[key] = cur.value(vtype, key)
        infos = []
        for i in range(n_tensors):
            name = cur.string(f"name of tensor {i}")
            if len(name) > _MAX_NAME:
                raise cur.fail(f"tensor {i} has an over-long name")
            n_dims = cur.u32(f"dims of {name!r}")
            if not 1 <= n_dims <= _MAX_DIMS:
                raise cur.fail(f"tensor {name!r} has {n_dims} dimensions")
            ne = [cur.u64(f"shape of {name!r}") for _ in range(n_dims)]
            ggml_type = cur.u32(f"type of {name!r}")
            offset = cur.u64(f"offset of {name!r}")
            infos.append((name, ne, ggml_type, offset))
        align = self.metadata.get("general.alignment", 32)
        # the spec: an integer, a multiple of 8 (and a power of two, as GGML_PAD needs); a bool is no alignment
        if type(align) is not int or align < 8 or align > _MAX_ALIGN or align & (align - 1):
            raise GGUFError(f"{self.path}: general.alignment must be an integer power of two from 8 to "
                            f"{_MAX_ALIGN}, got {align!r}")
        self.data_offset = -(-cur.pos // align) * align
        self.tensors: dict[str, TensorInfo] = {}
        for name, ne, ggml_type, offset in infos:
            if name in self.tensors:
                raise GGUFError(f"{self.path}: duplicate tensor {name!r}")
            self.tensors[name] = self._tensor(name, ne, ggml_type, offset)
        arch = self.metadata.get("general.architecture")
        if not isinstance(arch, str):
            raise GGUFError(f"{self.path}: missing metadata key 'general.architecture'")
        self.architecture: str = arch

    def _tensor(self, name: str, ne: list[int], ggml_type: int, offset: int) -> TensorInfo:
        try:
            qtype = GGMLQuantizationType(ggml_type)
        except ValueError:
            raise GGUFError(f"{self.path}: tensor {name!r} has unknown type id {ggml_type}") from None
        block, type_size = GGML_QUANT_SIZES[qtype]
        if any(d == 0 or d > (1 << 40) for d in ne):
            raise GGUFError(f"{self.path}: tensor {name!r} has an invalid shape {ne}")
        if ne[0] % block:
            raise GGUFError(f"{self.path}: tensor {name!r} row of {ne[0]} is not a multiple of {qtype.name} blocks")
        n_rows = int(np.prod(ne[1:], dtype=np.float64)) if len(ne) > 1 else 1
        row_bytes = ne[0] // block * type_size
        nbytes = n_rows * row_bytes
        start = self.data_offset + offset
        if offset % 32 or start + nbytes > len(self._mm):
            raise GGUFError(
                f"{self.path}: tensor {name!r} ({nbytes} bytes at offset {start}) lies outside the file "
                f"of {len(self._mm)} bytes (truncated?)"
            )
        shape = tuple(reversed(ne))
        raw = self._mm[start : start + nbytes]
        data: np.ndarray
        if qtype == GGMLQuantizationType.F32:
            data = raw.view(np.float32).reshape(shape)
        elif qtype == GGMLQuantizationType.F16:
            data = raw.view(np.float16).reshape(shape)
        else:
            data = raw.reshape(*shape[:-1], row_bytes)
        return TensorInfo(name, int(qtype), shape, data)

    # ---- metadata access --------------------------------------------------------------------------------
    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    def require(self, key: str) -> Any:
        if key not in self.metadata:
            raise GGUFError(f"{self.path}: missing metadata key {key!r}")
        return self.metadata[key]

    def arch_key(self, suffix: str) -> str:
        return f"{self.architecture}.{suffix}"

    def tensor(self, name: str, shape: tuple[int, ...] | None = None) -> TensorInfo:
        """The tensor `name`; `shape` (numpy order) is checked when given."""
        t = self.tensors.get(name)
        if t is None:
            raise ProviderError(f"{self.path}: missing tensor {name!r} (architecture {self.architecture})")
        if shape is not None and t.shape != tuple(shape):
            raise ProviderError(f"{self.path}: tensor {name!r} has shape {t.shape}, expected {tuple(shape)}")
        return t

    def __iter__(self) -> Iterator[TensorInfo]:
        return iter(self.tensors.values())

    def file_size(self) -> int:
        return len(self._mm)


def open_gguf(path: str | os.PathLike[str]) -> GGUFFile:
    return GGUFFile(path)
