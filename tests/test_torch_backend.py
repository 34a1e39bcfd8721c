"""The PyTorch backend (cuca.gpu) on CPU tensors ("torch-cpu"): what the GPU device runs, checked without a GPU.

Logits against the C backend per architecture, within a stated tolerance (relative to the largest |logit|): F32
files 2e-5 (the same float32 arithmetic in another order); the real quantized models 0.1 with every row's arg-max
equal (the C kernels quantize activations to 8 bits before a quantized matmul, the torch backend multiplies
dequantized weights in float32; measured 0.040 for SmolLM2 Q4_1 and 0.043 for Gemma 3 Q4_K_M, 12 of 14 and 13
of 15 rows with the same arg-max). Greedy speculative
output equals plain output for the Gemma 4 + assistant pair, Qwen 3.5 with a draft model (its in-trunk head is
CPU-only) and prompt lookup: torch-cpu computes every row alone (batch invariant), as the C kernels do.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import real_model_path
from helpers import Cycle, plain, same_cache, scripted, spec

torch = pytest.importorskip("torch")

from cuca import DrafterSource, LocalModel, LocalModelConfig  # noqa: E402
from cuca.gguf import open_gguf  # noqa: E402
from cuca.gpu.ops import TorchOps  # noqa: E402
from cuca.models import load_model  # noqa: E402
from cuca.models.deltanet_state import HybridCache  # noqa: E402
from cuca.models.gemma4_assistant import load_assistant  # noqa: E402
from cuca.models.layers import Ops  # noqa: E402
from cuca.speculative.drafters.assistant import AssistantDrafter  # noqa: E402
from cuca.speculative.drafters.draft_model import DraftModelDrafter  # noqa: E402
from cuca.speculative.drafters.prompt_lookup import PromptLookupDrafter  # noqa: E402
from cuca.tokenizer import Tokenizer  # noqa: E402

DIR = Path(__file__).parent / "fixtures" / "converted"
TEXT = "The capital of France is Paris, and the capital of Italy is"
TOKENS = np.array([5, 17, 33, 2, 99, 12, 7, 5, 17, 33], np.int32)
PROMPTS = [[2, 10, 11, 12, 13, 14, 10, 11, 12], [2, 7, 9, 7, 9, 7, 9, 7], [2, 120, 1, 120, 1, 120]]
_models: dict[tuple[str, str], Any] = {}


def model(name: str, backend: str = "torch") -> Any:
    key = (name, backend)
    if key not in _models:
        path = real_model_path(name) if name in ("smollm2", "gemma3") else DIR / f"{name}.gguf"
        _models[key] = load_model(open_gguf(path), TorchOps(threads=1) if backend == "torch" else Ops(1))
    return _models[key]


def logits(m: Any, tokens: np.ndarray) -> np.ndarray:
    """A prefill of `tokens` (every row's logits) and one decode step after it."""
    cache = m.make_cache(96)
    n = len(tokens)
    a = m.forward(tokens, np.arange(n, dtype=np.int32), cache, "all")
    b = m.forward(np.array([3], np.int32), np.array([n], np.int32), cache)
    return np.concatenate([a, b])


@pytest.mark.parametrize("name, tol", [("llama3-f32", 2e-5), ("qwen3-f32", 2e-5), ("qwen2-f32", 2e-5),
                                       ("gemma4-f32", 2e-5), ("qwen35-f32", 2e-5), ("qwen35g-f32", 2e-5),
                                       ("smollm2", 0.1), ("gemma3", 0.1)])
def test_logits_match_the_c_backend(name: str, tol: float) -> None:
    tokens = TOKENS
    if name in ("smollm2", "gemma3"):  # a real prompt; the arg-max may differ by quantization noise on a few rows
        tokens = np.array(Tokenizer.from_gguf(real_model_path(name)).encode(TEXT), np.int32)
    want, got = logits(model(name, "c"), tokens), logits(model(name), tokens)
    assert got.dtype == np.float32 and got.shape == want.shape
    assert np.abs(got - want).max() <= tol * np.abs(want).max()
    same = np.mean(got.argmax(-1) == want.argmax(-1))
    assert same == 1.0 or (tol > 2e-5 and same >= 0.75)  # measured: 12/14 and 13/15 rows on the real models


@pytest.mark.parametrize("drafter", ["assistant-f32", "assistant-centroids-f32"])
def test_assistant_step_matches_the_c_backend(drafter: str) -> None:
    out = []
    for backend in ("c", "torch"):
        target = model("gemma4-f32", backend)
        ops = target.ops
        a = load_assistant(open_gguf(DIR / f"{drafter}.gguf"), ops, target, requantize=False)
        cache = target.make_cache(32)
        h = target.forward_hidden(TOKENS, np.arange(len(TOKENS), dtype=np.int32), cache)
        out.append(a.step(np.array([7], np.int32), h[-1:], len(TOKENS), cache))
    (lc, hc), (lt, ht) = out
    assert np.abs(lt - lc).max() <= 2e-5 * np.abs(lc).max() and np.abs(ht - hc).max() <= 2e-5 * np.abs(hc).max()


@pytest.mark.parametrize("name", ["llama3-f32", "gemma4-f32", "qwen35-f32"])
def test_rows_do_not_depend_on_the_batch(name: str) -> None:
    """M rows in one pass equal the same rows run one by one, bit for bit (what greedy identity rests on)."""
    m = model(name)
    ca, cb = m.make_cache(32), m.make_cache(32)
    pos = np.arange(len(TOKENS), dtype=np.int32)
    together = m.forward(TOKENS, pos, ca, "all")
    alone = np.concatenate([m.forward(TOKENS[i : i + 1], pos[i : i + 1], cb) for i in range(len(TOKENS))])
    assert np.array_equal(together, alone)


def _pairs() -> dict[str, Any]:
    g4, q35, ll = model("gemma4-f32"), model("qwen35-f32"), model("llama3-f32")
    assistant = load_assistant(open_gguf(DIR / "assistant-f32.gguf"), g4.ops, g4, requantize=False)
    draft = model("qwen35-q8_0")
    return {
        "gemma4+assistant": (g4, lambda eng: AssistantDrafter(assistant, eng.cache)),
        "qwen35+draft-model": (q35, lambda eng: DraftModelDrafter(draft, eng.cache.n_ctx, q35.n_vocab)),
        "llama3+prompt-lookup": (ll, lambda eng: PromptLookupDrafter(3)),
    }


@pytest.mark.parametrize("pair_name", ["gemma4+assistant", "qwen35+draft-model", "llama3+prompt-lookup"])
def test_greedy_speculation_equals_plain_on_torch_cpu(pair_name: str) -> None:
    pair = _pairs()[pair_name]
    drafted = accepted = 0
    for prompt in PROMPTS:
        want, peng, _ = plain(pair[0], prompt, 16, 64)
        for k in (1, 3, 6):
            got, seng, _, stats = spec(pair, prompt, 16, k, 64)
            assert got == want and same_cache(peng, seng)
            drafted, accepted = drafted + stats.drafted, accepted + stats.accepted
    assert drafted > 0
    assert accepted > 0 or pair_name == "gemma4+assistant"  # random synthetic assistant: rarely right


def test_local_model_on_torch_cpu() -> None:
    """The config's device runs the whole request path: a drafter file on the device, and the output equals the C
    backend's on an F32 file."""
    cfg = LocalModelConfig(DIR / "qwen35-f32.gguf", drafter=DrafterSource.file(DIR / "qwen35-q8_0.gguf"),
                           device="torch-cpu", threads=1, context_length=64)
    lm = LocalModel.load_sync(cfg)
    assert isinstance(lm.model.ops, TorchOps) and isinstance(lm.engine.cache.kv.k[0], torch.Tensor)
    want = LocalModel.load_sync(LocalModelConfig(DIR / "qwen35-f32.gguf", threads=1, context_length=64))
    ids = PROMPTS[0]
    r = lm.complete_sync(ids, max_tokens=12)
    assert r.tokens == lm.complete_sync(ids, max_tokens=12, draft=False).tokens
    assert r.tokens == want.complete_sync(ids, max_tokens=12).tokens
    assert r.draft is not None and r.draft.drafted > 0


def test_auto_never_picks_the_cpu_only_head_on_a_torch_device() -> None:
    lm = LocalModel.load_sync(LocalModelConfig(DIR / "qwen35-f32.gguf", drafter="auto", device="torch-cpu", threads=1,
                                               context_length=32))
    assert lm.drafter_source is not None and lm.drafter_source.kind == "prompt_lookup"


def test_per_layer_table_stays_on_the_host() -> None:
    g4 = model("gemma4-f32")
    assert isinstance(g4.per_layer_token_embd.w, np.ndarray) and isinstance(g4.token_embd.w, torch.Tensor)


def _static(name: str) -> Any:
    key = (name, "static")
    if key not in _models:
        ops = TorchOps(threads=1, passes="static")
        ops.pass_rows = 7
        _models[key] = load_model(open_gguf(DIR / f"{name}.gguf"), ops)
    return _models[key]


@pytest.mark.parametrize("name", ["llama3-f32", "gemma4-f32", "qwen35-f32"])
def test_static_passes_equal_eager_ones(name: str) -> None:
    """The path CUDA graphs capture (token ids, positions and Gemma 4's host-table rows from static buffers, K/V
    written at device positions, attention over the whole cache masked by position, the hybrid cache's bookkeeping
    around the pass), run eagerly on CPU tensors: plain and speculative greedy output and caches equal the eager
    backend's, and the logits within float32 rounding."""
    eager, static = model(name), _static(name)
    want, weng, _ = plain(eager, PROMPTS[0], 12, 64)
    got, seng, _ = plain(static, PROMPTS[0], 12, 64)
    assert got == want and len(static._runners) > 0
    ca, cb = weng.cache, seng.cache
    kva, kvb = getattr(ca, "kv", ca), getattr(cb, "kv", cb)
    n = ca.n
    assert n == cb.n and all(np.allclose(x[:, :n], y[:, :n], atol=1e-5) for x, y in zip(kva.k, kvb.k, strict=True))
    if name == "gemma4-f32":
        assistant = load_assistant(open_gguf(DIR / "assistant-f32.gguf"), static.ops, static, requantize=False)
        pair: Any = (static, lambda eng: AssistantDrafter(assistant, eng.cache))
    elif name == "qwen35-f32":
        draft = _static("qwen35-q8_0")
        pair = (static, lambda eng: DraftModelDrafter(draft, eng.cache.n_ctx, static.n_vocab))
    else:
        pair = (static, lambda eng: PromptLookupDrafter(3))
    for k in (2, 6):
        out, eng, _, stats = spec(pair, PROMPTS[0], 12, k, 64)
        assert out == want and same_cache(seng, eng) and stats.drafted > 0
    cache = static.make_cache(16)
    h = static.forward_hidden(TOKENS[:5], np.arange(5, dtype=np.int32), cache)
    assert np.array_equal(static.argmax(h), static.head(h).argmax(-1))  # the pass's own arg-max and logits
    assert np.allclose(static.head(h), eager.head(h), rtol=0, atol=2e-5 * np.abs(eager.head(h)).max())


def test_graph_passes_need_cuda() -> None:
    with pytest.raises(ValueError, match="CUDA only"):
        TorchOps("cpu", passes="graph")


@pytest.mark.parametrize("passes", ["eager", "static"])
@pytest.mark.parametrize("drafter", ["assistant-f32", "assistant-centroids-f32"])
def test_chained_greedy_drafts_equal_step_by_step(passes: str, drafter: str) -> None:
    """The assistant's greedy steps chained on the device (one copy back per proposal) equal the host loop."""
    target = model("gemma4-f32") if passes == "eager" else _static("gemma4-f32")
    a = load_assistant(open_gguf(DIR / f"{drafter}.gguf"), target.ops, target, requantize=False)
    cache = target.make_cache(32)
    h = target.forward_hidden(TOKENS, np.arange(len(TOKENS), dtype=np.int32), cache)
    for tok in (7, 300):
        want, hh, t = [], h[-1:], tok
        for _ in range(4):
            logits, hh = a.step(np.array([t], np.int32), hh, len(TOKENS), cache)
            t = int(np.argmax(logits[0]))
            want.append(t)
        assert a.draft_greedy(tok, h[-1:], len(TOKENS), cache, 4) == want


def test_long_qwen35_prefill_takes_the_chunked_form() -> None:
    """80 rows in one pass: the torch backend's DeltaNet layers run the chunked form (its port of gdn_chunked), the
    C backend's the recurrence (Ops.deltanet_chunk_min): the same logits up to rounding."""
    tokens = np.resize(TOKENS, 80)
    want, got = logits(model("qwen35-f32", "c"), tokens), logits(model("qwen35-f32"), tokens)
    assert np.abs(got - want).max() <= 2e-5 * np.abs(want).max()


class _FakeGraph:
    """A stand-in for torch.cuda.CUDAGraph on CPU tensors: replay reruns the captured body and writes its results
    into the tensors the capture returned, as a real replay rewrites them; what the body's Python did to the hybrid
    cache's raw-input references (`keep_raw`, which a real replay would not run) is undone after it."""

    replaying = False
    touched: dict[int, tuple[Any, list[Any]]] = {}  # id(cache) -> (cache, its raw inputs before the replay)

    def __init__(self, body: Any, out: Any):
        self.body, self.out = body, out

    def replay(self) -> None:
        _FakeGraph.replaying, _FakeGraph.touched = True, {}
        try:
            self._replay()
        finally:
            _FakeGraph.replaying = False
            for cache, old in _FakeGraph.touched.values():
                cache._raw[:] = old

    @staticmethod
    def keep_raw(cache: Any, li: int, x: Any, orig: Any) -> None:
        if _FakeGraph.replaying and id(cache) not in _FakeGraph.touched:
            _FakeGraph.touched[id(cache)] = (cache, list(cache._raw))
        orig(cache, li, x)

    def _replay(self) -> None:
        def put(dst: Any, src: Any) -> None:
            if isinstance(dst, (tuple, list)):
                for d, s in zip(dst, src, strict=True):
                    put(d, s)
            else:
                dst.copy_(src)

        put(self.out, self.body())


@pytest.mark.parametrize("name", ["qwen35-f32", "gemma4-f32"])
def test_graph_mode_bookkeeping_on_cpu(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """passes="graph" with captures faked on CPU: the capture's dummy rows and restored recurrent state, the hybrid
    cache's rollback inputs taken from the graph's outputs, the assistant's chained step: plain and speculative
    greedy output as the eager backend's."""
    import cuca.gpu.graphs as graphs

    def fake_capture(device: Any, body: Any, warmup: int = 2) -> tuple[Any, Any]:
        for _ in range(warmup):
            body()
        out = body()
        return _FakeGraph(body, out), out

    monkeypatch.setattr(graphs, "capture", fake_capture)
    keep_raw = HybridCache.keep_raw
    monkeypatch.setattr(HybridCache, "keep_raw", lambda self, li, x: _FakeGraph.keep_raw(self, li, x, keep_raw))
    ops = TorchOps(threads=1, passes="static")
    ops.passes, ops.pass_rows = "graph", 7
    m = load_model(open_gguf(DIR / f"{name}.gguf"), ops)
    want, _, _ = plain(model(name), PROMPTS[1], 12, 64)
    got, geng, _ = plain(m, PROMPTS[1], 12, 64)
    assert got == want
    if name == "gemma4-f32":
        a = load_assistant(open_gguf(DIR / "assistant-f32.gguf"), ops, m, requantize=False)
        pair: Any = (m, lambda eng: AssistantDrafter(a, eng.cache))
    else:
        dops = TorchOps(threads=1, passes="static")
        dops.passes, dops.pass_rows = "graph", 7
        d = load_model(open_gguf(DIR / "qwen35-q8_0.gguf"), dops)
        pair = (m, lambda eng: DraftModelDrafter(d, eng.cache.n_ctx, m.n_vocab))
    # every third draft wrong (rollbacks of every depth); the cycle interleaves passes of every size after capture
    future = [t if i % 3 else (t + 1) % 256 for i, t in enumerate(want[1:])]
    for k in (1, 4, Cycle([2, 1, 3, 0])):
        for p in (pair, scripted(pair, future, len(PROMPTS[1]) + 1)):
            out, seng, _, stats = spec(p, PROMPTS[1], 12, k, 64)
            assert out == want and same_cache(geng, seng) and stats.drafted > 0
    assert all(p.graph is not None for r in m._runners.values() for p in r.passes.values())


def test_a_failed_capture_falls_back_to_static_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    import cuca.gpu.graphs as graphs

    def failing(device: Any, body: Any, warmup: int = 2) -> tuple[Any, Any]:
        body()  # the warm-up ran, then the capture failed
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(graphs, "capture", failing)
    ops = TorchOps(threads=1, passes="static")
    ops.passes, ops.pass_rows = "graph", 7
    m = load_model(open_gguf(DIR / "qwen35-f32.gguf"), ops)
    want, weng, _ = plain(model("qwen35-f32"), PROMPTS[1], 8, 64)
    got, geng, _ = plain(m, PROMPTS[1], 8, 64)
    assert got == want and ops.graph_errors and "not permitted" in ops.graph_errors[0]
