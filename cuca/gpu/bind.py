"""A model's weights to the device, and the host-facing view of a device model.

`bind(model, ops)` walks the model's blocks once: every `Linear` is dequantized from its GGUF blocks (cuca.quants)
chunk by chunk into a device tensor (the host never holds more than CHUNK_BYTES of float32 for it), except the
tables named in `ops.host_tables` (Gemma 4's 2.35 B-parameter per-layer embedding), which stay memory-mapped: the
step's rows are gathered and dequantized on the host and copied. Norm vectors, biases and conv taps become device
tensors. The result is a `HostModel`: what the engine, drafters, prompt cache and benchmarks call, numpy in and out,
while everything between runs on the device.
"""

from __future__ import annotations

import dataclasses
import os
import weakref
from collections.abc import Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Any, cast

import numpy as np
import torch

from ..models.batch import SeqRows
from ..models.cache import KVCache
from ..models.layers import Linear
from .graphs import Pass, PassRunner, StepRunner
from .ops import TorchOps

SKIP = frozenset({"ops", "target", "c", "spec", "rope", "mask", "path", "_heads"})  # not weights, or bound elsewhere


def bind(model: Any, ops: TorchOps) -> HostModel:
    """`model` (built on `ops`) with its weights on the device, behind a host-facing view."""
    if isinstance(model, HostModel):
        return model
    with ThreadPoolExecutor(max(1, min(ops.threads or (os.cpu_count() or 1), 16))) as pool:
        _upload(model, ops, set(), pool)
    return HostModel(model, ops)


def _upload(obj: Any, ops: TorchOps, seen: set[int], pool: Executor) -> None:
    if id(obj) in seen:
        return
    seen.add(id(obj))
    for name, v in list(vars(obj).items()):
        if name not in SKIP:
            new = _convert(v, ops, seen, pool)
            if new is not v:
                setattr(obj, name, new)


def _convert(v: Any, ops: TorchOps, seen: set[int], pool: Executor) -> Any:
    if isinstance(v, Linear):
        if id(v) not in seen and not isinstance(v.w, torch.Tensor) and v.name not in ops.host_tables:
            # a torch.Tensor where numpy is declared (the ignore is unused when torch is absent)
            v.w = ops.upload_weight(v.w, v.wtype, (v.n_out, v.n_in), pool)  # type: ignore[assignment, unused-ignore]
        seen.add(id(v))
        return v
    if isinstance(v, np.ndarray):
        return ops.tensor(v)
    if isinstance(v, list):
        out = [_convert(e, ops, seen, pool) for e in v]
        return out if any(a is not b for a, b in zip(out, v, strict=True)) else v
    if hasattr(v, "__dict__") and type(v).__module__.startswith("cuca.models") and not dataclasses.is_dataclass(v):
        _upload(v, ops, seen, pool)
    return v


class HostModel:
    """A device-bound model (or drafter) seen from the host: the Model protocol's methods (and the assistant's
    `step`) take and return numpy arrays; every other attribute is the model's own. Passes of up to
    `ops.pass_rows` rows go through static buffers (graphs.py: CUDA graphs on a GPU), one PassRunner per cache;
    `head` and `argmax` of the hidden states such a pass just returned reuse its logits and arg-max."""

    def __init__(self, inner: Any, ops: TorchOps):
        self.inner, self.ops = inner, ops
        self._runners: weakref.WeakKeyDictionary[Any, PassRunner] = weakref.WeakKeyDictionary()
        self._steps: weakref.WeakKeyDictionary[Any, StepRunner] = weakref.WeakKeyDictionary()
        self._last: tuple[np.ndarray, Pass, np.ndarray] | None = None  # (hidden as returned, its pass, arg-max)

    def __getattr__(self, name: str) -> Any:
        if name == "inner":  # not set yet (copy, unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)

    def _pass(self, tokens: np.ndarray, positions: np.ndarray, cache: Any) -> Pass | None:
        if self.ops.passes == "eager" or not 0 < len(tokens) <= min(self.ops.pass_rows, cache.n_ctx):
            return None
        if not hasattr(self.inner, "run"):
            return None
        runner = self._runners.get(cache)
        if runner is None:
            runner = self._runners[cache] = PassRunner(self.inner, cache, self.ops)
        return runner.run(tokens, positions)

    def forward(self, tokens: np.ndarray, positions: np.ndarray, cache: Any, logits: str = "last") -> np.ndarray:
        p = self._pass(tokens, positions, cache) if logits in ("last", "all") else None
        if p is not None:
            return self.ops.host(p.logits[-1:] if logits == "last" else p.logits)
        return self.ops.host(self.inner.forward(tokens, positions, cache, logits))

    def forward_hidden(self, tokens: np.ndarray, positions: np.ndarray, cache: Any) -> np.ndarray:
        p = self._pass(tokens, positions, cache)
        if p is None:
            return self.ops.host(self.inner.forward_hidden(tokens, positions, cache))
        both = self.ops.host(p.packed)  # hidden and arg-max in one copy: one synchronisation per pass
        h = both[:, :-1]
        self._last = (h, p, both[:, -1].astype(np.int64))
        return h

    def argmax(self, h: np.ndarray) -> np.ndarray:
        """The arg-max of each row's logits, computed on the device (only the ids are copied back)."""
        if self._last is not None and self._last[0] is h:
            return self._last[2]
        return self.ops.host(self.inner.head(self.ops.contiguous(h)).argmax(-1))

    def forward_batch(self, seqs: Sequence[SeqRows]) -> np.ndarray:
        return self.ops.host(self.inner.forward_batch(seqs))

    def head(self, h: np.ndarray) -> np.ndarray:
        if self._last is not None and self._last[0] is h:
            return self.ops.host(self._last[1].logits)
        return self.ops.host(self.inner.head(self.ops.contiguous(h)))

    def draft_greedy(self, tok: int, h: np.ndarray, pos: int, cache: Any, n: int) -> list[int]:
        """A drafter's n greedy steps chained on the device, one copy back (graphs.StepRunner); the assistant only."""
        runner = self._steps.get(cache)
        if runner is None:
            runner = self._steps[cache] = StepRunner(self.inner, cache, self.ops)
        return runner.draft(tok, h, pos, n)

    def step(self, tokens: np.ndarray, h: np.ndarray, pos: int, cache: Any,
             greedy: bool = True) -> tuple[np.ndarray, np.ndarray]:
        logits, nh = self.inner.step(tokens, self.ops.contiguous(h), pos, cache, greedy=greedy)
        return self.ops.host(logits), self.ops.host(nh)


class TorchKVCache(KVCache):
    """KVCache on device tensors: k[i] (n_kv_head, n_ctx, dk), v[i] (n_kv_head, n_ctx, dv), float32. Under a
    captured pass (`ops.static`) rows are written at the positions in the static buffer, not at pos0."""

    def __init__(self, n_ctx: int, shapes: list[tuple[int, int, int]], ops: TorchOps):
        self.n_ctx, self.ops = n_ctx, ops
        self.k = [ops.zeros((h, n_ctx, dk)) for h, dk, _ in shapes]
        self.v = [ops.zeros((h, n_ctx, dv)) for h, _, dv in shapes]
        self.n = 0

    def store(self, layer: int, pos0: int, k: Any, v: Any) -> None:
        s, kl, vl = self.ops.static, cast(Any, self.k[layer]), cast(Any, self.v[layer])
        if s is not None:
            kl.index_copy_(1, s.positions, k.transpose(0, 1))
            vl.index_copy_(1, s.positions, v.transpose(0, 1))
            return
        m = k.shape[0]
        kl[:, pos0 : pos0 + m] = k.transpose(0, 1)
        vl[:, pos0 : pos0 + m] = v.transpose(0, 1)
