"""The shared core of the architectures: every kernel call passes the configured thread count (through `Ops`), and
rows of several sequences in one pass (`forward_batch`) equal each sequence run alone, bit for bit, with the caches
(K/V, conv windows, recurrent states) left the same."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from synth import write_tiny
from synth_gemma4 import write_gemma4, write_gemma4_assistant

from cuca import kernels
from cuca.gguf import open_gguf
from cuca.models import load_model
from cuca.models.batch import SeqRows
from cuca.models.gemma4_assistant import load_assistant
from cuca.models.layers import Ops

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import synth_qwen35  # noqa: E402

# kernel -> index of its n_threads argument (get_rows has none)
THREADS_AT = {"matmul": 6, "attention": 9, "rms_norm": 4, "residual_norm": 7, "rope": 7, "silu_mul": 3,
              "gelu_mul": 3, "deltanet": 10, "deltanet_deferred": 13, "causal_conv": 5, "sigmoid": 2, "decay": 4,
              "softcap": 2, "attention_core": 20}


class Spy:
    """A kernel module that runs the real kernels and records the n_threads each call passed (None: left out)."""

    def __init__(self, impl: Any):
        self.calls: list[tuple[str, Any]] = []
        for name in ("get_rows", *THREADS_AT):
            setattr(self, name, self._wrap(name, getattr(impl, name)))

    def _wrap(self, name: str, fn: Any) -> Any:
        def call(*args: Any, **kw: Any) -> Any:
            if name in THREADS_AT:
                i = THREADS_AT[name]
                self.calls.append((name, args[i] if len(args) > i else kw.get("n_threads")))
            return fn(*args, **kw)

        return call


def _files(d: Path) -> dict[str, Path]:
    return {"llama": write_tiny(d / "l.gguf", arch="llama"), "gemma3": write_tiny(d / "g3.gguf", arch="gemma3"),
            "gemma4": write_gemma4(d / "g4.gguf"), "qwen35": synth_qwen35.write(d / "q.gguf")}


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return _files(tmp_path_factory.mktemp("blocks"))


@pytest.mark.parametrize("arch", ["llama", "gemma3", "gemma4", "qwen35"])
def test_every_kernel_call_passes_the_thread_count(files: dict[str, Path], arch: str) -> None:
    spy = Spy(kernels.impl)
    model = load_model(open_gguf(files[arch]), Ops(3, spy))  # type: ignore[arg-type]
    toks = np.array([2, 5, 7, 9, 11], np.int32)
    cache = model.make_cache(32)
    h = model.forward_hidden(toks, np.arange(5, dtype=np.int32), cache)
    model.head(h[-1:])
    model.forward(toks[:1], np.array([5], np.int32), cache)
    if arch == "gemma4":
        a = load_assistant(open_gguf(write_gemma4_assistant(files[arch].parent / "a.gguf")), model.ops, model)
        a.step(toks[:2], np.ascontiguousarray(h[-2:]), 5, cache)
    if arch == "qwen35":
        model.mtp_logits(model.mtp_forward(toks, h, np.arange(5, dtype=np.int32), model.make_mtp_cache(32)), 50)
    names = {n for n, _ in spy.calls}
    assert {"matmul", "rms_norm", "residual_norm"} <= names and names & {"silu_mul", "gelu_mul"}
    # Qwen 3.5's gated attention takes the steps, as the Gemma 4 drafter's layers do; the others one call
    assert ("attention" in names) == (arch in ("gemma4", "qwen35"))
    assert ("attention_core" in names) == (arch != "qwen35")
    assert arch != "qwen35" or {"causal_conv", "sigmoid", "decay", "deltanet_deferred"} <= names
    wrong = sorted({n for n, t in spy.calls if t != 3})
    assert not wrong, f"{arch}: kernels called without the configured thread count: {wrong}"


class StepsOps(Ops):
    """`Ops.residual` as the steps one by one (rms_norm, in-place add and scale): what a backend with its own rms_norm
    runs."""

    def residual(self, x: np.ndarray, y: np.ndarray, r: Any) -> np.ndarray:
        return self._residual_steps(x, y, r)


class AttentionStepsOps(Ops):
    """`Ops.attention_core` declined: every layer takes the attention steps one by one."""

    def attention_core(self, attn: Any, ys: Any, sq: Any) -> None:
        return None


@pytest.mark.parametrize("arch", ["llama", "gemma3", "gemma4", "qwen35"])
def test_attention_in_one_call_is_the_steps(files: dict[str, Path], arch: str) -> None:
    """Layers whose attention runs as one kernel call (q / k / v norms, RoPE, the K/V store, attention) give the
    bits of the steps, K/V cache included, in a prefill and a 2-row pass."""
    toks, pos = np.array([2, 5, 7, 9, 11], np.int32), np.arange(5, dtype=np.int32)
    outs = []
    for ops in (Ops(2), AttentionStepsOps(2)):
        model = load_model(open_gguf(files[arch]), ops)
        cache = model.make_cache(32)
        got = [model.forward_hidden(toks, pos, cache), model.forward(toks[:2], np.array([5, 6], np.int32), cache)]
        outs.append(got + [np.array(a) for a in cache.k] + [np.array(a) for a in cache.v])
    for one, steps in zip(*outs, strict=True):
        assert np.array_equal(one, steps)


@pytest.mark.parametrize("arch", ["llama", "gemma3", "gemma4", "qwen35"])
def test_fused_residual_is_the_steps_one_by_one(files: dict[str, Path], arch: str) -> None:
    """The models' residual steps through one kernel call give the bits of the steps one by one (and the drafter's)."""
    toks, pos = np.array([2, 5, 7, 9, 11], np.int32), np.arange(5, dtype=np.int32)
    outs = []
    for ops in (Ops(2), StepsOps(2)):
        model = load_model(open_gguf(files[arch]), ops)
        cache = model.make_cache(32)
        h = model.forward_hidden(toks, pos, cache)
        got = [h, model.forward(toks[:2], np.array([5, 6], np.int32), cache)]
        if arch == "gemma4":
            a = load_assistant(open_gguf(write_gemma4_assistant(files[arch].parent / "a.gguf")), ops, model)
            got += list(a.step(toks[:2], np.ascontiguousarray(h[-2:]), 5, cache))
        outs.append(got)
    for fused, steps in zip(*outs, strict=True):
        assert np.array_equal(fused, steps)


def _seqs() -> list[tuple[list[int], list[int]]]:
    """(prefix already cached, rows of this pass) per sequence: a fresh prefill, a decode step, a verify batch."""
    return [([], [2, 9, 8, 7, 6, 5]), ([2, 30, 31, 32, 33, 34, 35], [36]), ([2, 40, 41], [42, 43, 44, 45])]


def _cache_after(model: Any, prefix: list[int]) -> Any:
    cache = model.make_cache(64)
    if prefix:
        model.forward_hidden(np.array(prefix, np.int32), np.arange(len(prefix), dtype=np.int32), cache)
    return cache


def _state(cache: Any) -> list[np.ndarray]:
    kv = getattr(cache, "kv", cache)
    n = cache.n
    return [a[:, :n] for a in kv.k + kv.v] + list(getattr(cache, "conv", [])) + list(getattr(cache, "ssm", []))


@pytest.mark.parametrize("arch", ["llama", "gemma3", "gemma4", "qwen35"])
@pytest.mark.parametrize("impl", ["c", "numpy"])
def test_rows_of_several_sequences_equal_each_alone(files: dict[str, Path], arch: str, impl: str) -> None:
    impls = kernels.implementations()
    if impl not in impls:
        pytest.skip("the C extension is not built")
    if impl == "numpy" and arch not in ("llama", "qwen35"):
        pytest.skip("one attention-only and the hybrid architecture on the numpy twins keep the suite short")
    model = load_model(open_gguf(files[arch]), Ops(2, impls[impl]))
    if arch == "qwen35":
        model.chunked_prefill_min = 6  # the fresh 6-row prefill takes the chunked form, the others snapshot
    alone, alone_caches, rows = [], [], []
    for prefix, new in _seqs():
        c = _cache_after(model, prefix)
        pos = np.arange(len(prefix), len(prefix) + len(new), dtype=np.int32)
        alone.append(model.forward_hidden(np.array(new, np.int32), pos, c))
        alone_caches.append(c)
        rows.append(SeqRows(np.array(new, np.int32), pos, _cache_after(model, prefix)))
    together = model.forward_batch(rows)
    assert together.shape == (sum(a.shape[0] for a in alone), alone[0].shape[1])
    assert np.array_equal(together, np.concatenate(alone))
    assert np.array_equal(model.head(together), np.concatenate([model.head(a) for a in alone]))
    for a, b in zip(alone_caches, (r.cache for r in rows), strict=True):
        assert a.n == b.n and all(np.array_equal(x, y) for x, y in zip(_state(a), _state(b), strict=True))
    if arch == "qwen35":  # the verify sequence rolls back from its per-token snapshots as if it had run alone
        a, b = alone_caches[2], rows[2].cache
        a.trim(2)
        b.trim(2)
        assert all(np.array_equal(x, y) for x, y in zip(_state(a), _state(b), strict=True))


def test_a_batch_rejects_a_shared_cache_and_empty_rows(files: dict[str, Path]) -> None:
    model = load_model(open_gguf(files["llama"]), Ops(1))
    cache = model.make_cache(16)
    one = SeqRows(np.array([2], np.int32), np.array([0], np.int32), cache)
    with pytest.raises(ValueError, match="share a cache"):
        model.forward_batch([one, one])
    with pytest.raises(ValueError, match="at least one sequence"):
        model.forward_batch([])
    with pytest.raises(ValueError, match="one position per token"):
        model.forward_batch([SeqRows(np.array([2, 3], np.int32), np.array([0], np.int32), cache)])
    assert cache.n == 0


def test_ops_is_the_backend_seam() -> None:
    """A third backend changes `Ops` (its kernel module and array helpers), never a model file: the models reach
    kernels only through `ops` (no `ops.k` attribute access outside `cuca/models/ops.py`)."""
    root = Path(__file__).resolve().parents[1] / "cuca" / "models"
    for p in root.glob("*.py"):
        if p.name != "ops.py":
            text = p.read_text()
            assert "ops.k." not in text and ".k.matmul" not in text, p.name
