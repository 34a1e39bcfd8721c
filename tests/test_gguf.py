"""GGUF reading: typed metadata, zero-copy tensor views, and clear errors on malformed or hostile files."""

from __future__ import annotations

import struct
from pathlib import Path

import gguf
import numpy as np
import pytest

from cuca.errors import CucaError, GGUFError, ProviderError
from cuca.gguf import open_gguf


def write_small(path: Path) -> dict[str, np.ndarray]:
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_uint32("llama.block_count", 2)
    w.add_float32("llama.rope.freq_base", 10000.0)
    w.add_string("general.name", "tiny ☃")
    w.add_bool("tokenizer.ggml.add_bos_token", True)
    w.add_array("tokenizer.ggml.tokens", ["a", "b", "ü"])
    w.add_array("tokenizer.ggml.scores", [0.5, -1.0, 2.0])
    rng = np.random.default_rng(0)
    tensors = {
        "token_embd.weight": rng.standard_normal((3, 32)).astype(np.float32),
        "blk.0.attn_q.weight": rng.standard_normal((4, 64)).astype(np.float16),
    }
    for name, arr in tensors.items():
        w.add_tensor(name, arr)
    q = gguf.quants.quantize(rng.standard_normal((2, 64)).astype(np.float32), gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("blk.0.ffn_up.weight", q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    tensors["blk.0.ffn_up.weight"] = q
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return tensors


def test_reads_metadata_and_tensors(tmp_path: Path) -> None:
    p = tmp_path / "m.gguf"
    tensors = write_small(p)
    f = open_gguf(p)
    assert f.architecture == "llama"
    assert f.get("llama.block_count") == 2
    assert f.get("general.name") == "tiny ☃"
    assert f.get("tokenizer.ggml.add_bos_token") is True
    assert f.get("tokenizer.ggml.tokens") == ["a", "b", "ü"]
    assert f.get("tokenizer.ggml.scores") == pytest.approx([0.5, -1.0, 2.0])
    for name, arr in tensors.items():
        t = f.tensor(name)
        assert np.asarray(t.data).tobytes() == np.ascontiguousarray(arr).tobytes()
    q8 = f.tensor("blk.0.ffn_up.weight")
    assert q8.type_name == "Q8_0" and q8.shape == (2, 64) and q8.data.shape == (2, 68)
    assert isinstance(q8.data.base, np.memmap) or isinstance(q8.data, np.memmap)  # a view, not a copy


def test_missing_key_and_tensor_name_them(tmp_path: Path) -> None:
    p = tmp_path / "m.gguf"
    write_small(p)
    f = open_gguf(p)
    with pytest.raises(GGUFError, match="llama.context_length") as e:
        f.require("llama.context_length")
    assert str(p) in str(e.value)
    with pytest.raises(ProviderError, match="output_norm.weight"):
        f.tensor("output_norm.weight")
    with pytest.raises(ProviderError, match="expected"):
        f.tensor("token_embd.weight", (4, 32))


def test_every_truncation_is_a_clear_error(tmp_path: Path) -> None:
    p = tmp_path / "m.gguf"
    write_small(p)
    raw = p.read_bytes()
    cuts = sorted(set(list(range(0, 200, 7)) + list(range(200, len(raw), max(1, len(raw) // 40)))))
    for cut in cuts:
        q = tmp_path / f"cut{cut}.gguf"
        q.write_bytes(raw[:cut])
        with pytest.raises(GGUFError) as e:
            open_gguf(q)
        assert str(q) in str(e.value)


def _header(n_tensors: int, n_kv: int) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", 3, n_tensors, n_kv)


def _kv_string(key: str, value: str) -> bytes:
    k, v = key.encode(), value.encode()
    return struct.pack("<Q", len(k)) + k + struct.pack("<I", 8) + struct.pack("<Q", len(v)) + v


@pytest.mark.parametrize(
    "blob, match",
    [
        (b"GGUX" + b"\0" * 40, "bad magic"),
        (b"GGUF" + struct.pack("<IQQ", 7, 0, 0), "version 7"),
        (_header(0, 1 << 60), "too many"),
        (_header(1 << 59, 0), "too many"),
        # an array claiming 2**62 items
        (_header(0, 1) + struct.pack("<Q", 1) + b"a" + struct.pack("<IIQ", 9, 4, 1 << 62), "more than the file"),
        # a string claiming 2**63 bytes
        (_header(0, 1) + struct.pack("<Q", 1 << 63), "truncated"),
        # an unknown value type
        (_header(0, 1) + struct.pack("<Q", 1) + b"a" + struct.pack("<I", 99), "unknown value type"),
    ],
)
def test_hostile_headers(tmp_path: Path, blob: bytes, match: str) -> None:
    p = tmp_path / "bad.gguf"
    p.write_bytes(blob + b"\0" * 64)
    with pytest.raises(GGUFError, match=match):
        open_gguf(p)


def _tensor_entry(name: str, ne: list[int], ggml_type: int, offset: int) -> bytes:
    n = name.encode()
    out = struct.pack("<Q", len(n)) + n + struct.pack("<I", len(ne))
    out += b"".join(struct.pack("<Q", d) for d in ne)
    return out + struct.pack("<IQ", ggml_type, offset)


@pytest.mark.parametrize(
    "ne, ggml_type, offset, match",
    [
        ([32, 1 << 39], 0, 0, "outside the file"),  # claims 64 TiB
        ([32, 4], 0, 1 << 50, "outside the file"),
        ([33, 1], 8, 0, "not a multiple"),  # Q8_0 row of 33
        ([32, 1], 1234, 0, "unknown type"),
        ([0, 4], 0, 0, "invalid shape"),
    ],
)
def test_hostile_tensor_infos(tmp_path: Path, ne: list[int], ggml_type: int, offset: int, match: str) -> None:
    body = _header(1, 1) + _kv_string("general.architecture", "llama") + _tensor_entry("t", ne, ggml_type, offset)
    p = tmp_path / "bad.gguf"
    p.write_bytes(body + b"\0" * 256)
    with pytest.raises(GGUFError, match=match):
        open_gguf(p)


def test_missing_file_and_not_a_file(tmp_path: Path) -> None:
    with pytest.raises(GGUFError, match="no such file"):
        open_gguf(tmp_path / "nope.gguf")
    (tmp_path / "empty.gguf").write_bytes(b"")
    with pytest.raises(CucaError):
        open_gguf(tmp_path / "empty.gguf")
