"""Architectures on tiny synthetic files in the real layouts: math against an independent float64 numpy
reference, batched prefill == token-by-token decode bit for bit, cache rollback, and load errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from reference import reference_forward
from synth import Edits, Q, write_tiny

from cuca.errors import GGUFError, ProviderError
from cuca.gguf import open_gguf
from cuca.models import load_model
from cuca.models.layers import Ops

ARCHS = ["llama", "gemma3"]


def _load(path: Path, threads: int = 2):  # type: ignore[no-untyped-def]
    return load_model(open_gguf(path), Ops(threads))


PROMPT = [2, 100, 7, 42, 300, 5, 17, 260, 99, 1, 150, 151, 152, 33, 34]


@pytest.mark.parametrize("arch", ARCHS)
def test_f32_math_matches_reference(tmp_path: Path, arch: str) -> None:
    path = write_tiny(tmp_path / f"{arch}.gguf", arch=arch, qtype=Q.F32)
    m = _load(path)
    cache = m.make_cache(64)
    got = m.forward(np.array(PROMPT, np.int32), np.arange(len(PROMPT), dtype=np.int32), cache, "all")
    want = reference_forward(path, PROMPT)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q4_0, Q.F16])
def test_quantized_close_to_reference(tmp_path: Path, arch: str, qtype: int) -> None:
    """Quantized activations add a little error; the reference uses the same dequantized weights."""
    path = write_tiny(tmp_path / f"{arch}.gguf", arch=arch, qtype=qtype)
    m = _load(path)
    got = m.forward(np.array(PROMPT, np.int32), np.arange(len(PROMPT), dtype=np.int32), m.make_cache(64), "all")
    want = reference_forward(path, PROMPT)
    err = np.abs(got - want).max() / np.abs(want).max()
    assert err < 0.03, err
    assert (got.argmax(-1) == want.argmax(-1)).mean() >= 0.8


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q4_1])
def test_prefill_equals_decode_bit_for_bit(tmp_path: Path, arch: str, qtype: int) -> None:
    """The model-level consequence of batch-invariant kernels: a position's logits do not depend on how the
    tokens before it were batched."""
    path = write_tiny(tmp_path / f"{arch}.gguf", arch=arch, qtype=qtype)
    m = _load(path)
    toks = np.array(PROMPT, np.int32)
    pos = np.arange(len(PROMPT), dtype=np.int32)
    batched = m.forward(toks, pos, m.make_cache(64), "all")
    cache = m.make_cache(64)
    one_by_one = np.concatenate([m.forward(toks[i : i + 1], pos[i : i + 1], cache, "all") for i in range(len(toks))])
    assert np.array_equal(batched, one_by_one)
    # mixed chunks, and another thread count
    m1 = _load(path, threads=1)
    cache = m1.make_cache(64)
    parts = [m1.forward(toks[a:b], pos[a:b], cache, "all") for a, b in ((0, 4), (4, 5), (5, 12), (12, 15))]
    assert np.array_equal(batched, np.concatenate(parts))


@pytest.mark.parametrize("arch", ARCHS)
def test_trim_rolls_back_exactly(tmp_path: Path, arch: str) -> None:
    path = write_tiny(tmp_path / f"{arch}.gguf", arch=arch)
    m = _load(path)
    toks = np.array(PROMPT, np.int32)
    pos = np.arange(len(PROMPT), dtype=np.int32)
    cache = m.make_cache(64)
    m.forward(toks[:10], pos[:10], cache)
    m.forward(np.array([3, 4, 5], np.int32), pos[10:13], cache, "all")  # rejected drafts
    cache.trim(3)
    assert cache.n == 10
    after = m.forward(toks[10:], pos[10:], cache, "all")
    clean = m.forward(toks, pos, m.make_cache(64), "all")[10:]
    assert np.array_equal(after, clean)


def test_missing_tensor_and_key_are_named(tmp_path: Path) -> None:
    p = write_tiny(tmp_path / "a.gguf", edits=Edits(skip=("blk.1.ffn_up.weight",)))
    with pytest.raises(ProviderError, match=r"blk\.1\.ffn_up\.weight"):
        _load(p)
    p = write_tiny(tmp_path / "b.gguf", arch="gemma3",
                   edits=Edits(drop_keys=("gemma3.attention.key_length",)))
    with pytest.raises(GGUFError, match="gemma3.attention.key_length"):
        _load(p)


def test_unsupported_architecture(tmp_path: Path) -> None:
    import gguf

    p = tmp_path / "x.gguf"
    w = gguf.GGUFWriter(str(p), "mamba")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ProviderError, match="mamba"):
        _load(p)
