"""Passes of M = 1..pass_rows rows (the decode step, the verify passes of every round length) through static
buffers: on a GPU each M is captured once as a CUDA graph (after a warm-up on a side stream) and replayed, so a
step costs one graph launch instead of hundreds of kernel launches from Python; on CPU tensors ("static") the same
buffers are run eagerly, which checks that path without a GPU.

A captured pass reads its token ids, positions and (Gemma 4) the per-layer embedding rows from `StaticInputs`,
writes K/V at those positions of its cache's fixed buffers and returns hidden states, logits and their arg-max in
fixed output tensors. What the Python forward does on the host is done here around the replay: the room check,
the cache's counters, and for the hybrid cache the per-batch snapshot bookkeeping (`begin`, the raw conv inputs a
rollback rebuilds the windows from).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..models.batch import Batch, SeqRows
from ..models.layers import Linear
from .ops import StaticInputs, TorchOps


def capture(device: torch.device, body: Any, warmup: int = 2) -> tuple[Any, Any]:
    """(CUDA graph of `body`, its outputs): `warmup` eager runs on a side stream first (allocations, lazy tables,
    cuBLAS handles), then the capture, on `device` whatever thread calls (a LocalModel's worker)."""
    with torch.cuda.device(device):
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(warmup):
                body()
        torch.cuda.current_stream(device).wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = body()
    return g, out


@dataclass
class Pass:
    """One M's static inputs and outputs (device tensors, overwritten by every run of this M)."""

    m: int
    static: StaticInputs
    graph: Any = None  # torch.cuda.CUDAGraph once captured
    hidden: Any = None  # (M, n_embd) post-norm
    logits: Any = None  # (M, n_vocab)
    argmax: Any = None  # (M,) int64
    packed: Any = None  # (M, n_embd + 1) float32: hidden | arg-max (exact below 2^24), one copy to the host
    raws: list[Any] = field(default_factory=list)  # hybrid cache: the raw conv inputs the graph writes


class PassRunner:
    """The static passes of `model` (a device-bound Decoder) on one `cache`."""

    def __init__(self, model: Any, cache: Any, ops: TorchOps):
        self.model, self.cache, self.ops = model, cache, ops
        self.hybrid = hasattr(cache, "begin")
        self.host_tables = [v for v in vars(model).values()
                            if isinstance(v, Linear) and not isinstance(v.w, torch.Tensor)]
        self.passes: dict[int, Pass] = {}

    def run(self, tokens: np.ndarray, positions: np.ndarray) -> Pass:
        """One pass over `tokens` at `positions` (one ascending run continuing the cache)."""
        m, cache = len(tokens), self.cache
        cache.check_room(int(positions[0]), m)
        p = self.passes.get(m)
        if p is None:
            p = self.passes[m] = self._prepare(m)
        self._fill(p, tokens, positions)
        if self.hybrid:
            cache.begin(m)
        if p.graph is not None:
            p.graph.replay()
            if self.hybrid:
                cache._raw[:] = p.raws  # what the captured conv step wrote, for a rollback
        else:
            p.hidden, p.logits, p.argmax, p.packed, p.raws = self._body(p, tokens, positions)
        cache.advance(int(positions[-1]) + 1)
        return p

    def _fill(self, p: Pass, tokens: np.ndarray, positions: np.ndarray) -> None:
        p.static.tokens.copy_(torch.from_numpy(np.asarray(tokens, np.int64)))
        p.static.positions.copy_(torch.from_numpy(np.asarray(positions, np.int64)))
        p.static.kv_end.copy_(p.static.positions + 1)
        for w in self.host_tables:  # rows of the host-resident tables, dequantized here and copied over
            p.static.host_rows[w.name].copy_(self.ops.host_rows(w, tokens))

    def _body(self, p: Pass, tokens: np.ndarray, positions: np.ndarray) -> tuple[Any, Any, Any, Any, list[Any]]:
        """The pass: (hidden, logits, arg-max, hidden | arg-max, the hybrid cache's raw conv inputs)."""
        self.ops.static = p.static
        try:
            h = self.model.run(Batch([SeqRows(tokens, positions, self.cache)]))
            logits = self.model.head(h)
            am = logits.argmax(-1)
            raws = list(self.cache._raw) if self.hybrid else []
            return h, logits, am, torch.cat([h, am[:, None].float()], dim=1), raws
        finally:
            self.ops.static = None

    def _prepare(self, m: int) -> Pass:
        """Static buffers for M rows; on a GPU the pass captured (its warm-up and capture write K/V at the last m
        positions, which are rewritten before they are read, and leave the recurrent state as it was)."""
        ops, cache = self.ops, self.cache
        p = Pass(m, StaticInputs(m, ops.device))
        tokens = np.zeros(m, np.int32)
        for w in self.host_tables:
            p.static.host_rows[w.name] = ops.host_rows(w, tokens)
        if ops.passes != "graph":
            return p
        positions = np.arange(cache.n_ctx - m, cache.n_ctx, dtype=np.int32)
        self._fill(p, tokens, positions)
        snap = cache.snapshot() if self.hybrid else None
        try:
            p.graph, out = capture(ops.device, lambda: self._body(p, tokens, positions))
            p.hidden, p.logits, p.argmax, p.packed, p.raws = out
        except RuntimeError as e:  # not capturable here: this M runs eagerly through the same buffers
            ops.graph_errors.append(f"pass of {m} rows: {e}")
            p.graph = None
        finally:
            if self.hybrid:
                cache.restore(snap)
        return p


class StepRunner:
    """Greedy drafting with a gemma4-assistant (a device-bound `Assistant`) on its target's `cache`: n steps chained
    on the device (each step's arg-max and next hidden feed the next one) and one copy of the n ids back. With
    `ops.passes` "graph" the step is captured once and replayed; "static" runs it through the same buffers,
    "eager" without them."""

    def __init__(self, assistant: Any, cache: Any, ops: TorchOps):
        self.assistant, self.cache, self.ops = assistant, cache, ops
        self.static = StaticInputs(1, ops.device)
        self.h = ops.zeros((1, assistant.n_embd_out))
        self.graph: Any = None
        self.out: tuple[Any, Any] | None = None  # (arg-max (1,), next hidden (1, n_embd_out)) of the captured step
        if ops.passes == "graph":
            self._capture()

    def _step(self, tokens: Any, pos: int) -> tuple[Any, Any]:
        logits, h = self.assistant.step(tokens, self.h, pos, self.cache)
        return logits.argmax(-1), h

    def _static_step(self) -> tuple[Any, Any]:
        self.ops.static = self.static
        try:
            return self._step(np.zeros(1, np.int32), 1)  # ids and position come from the static buffers
        finally:
            self.ops.static = None

    def _capture(self) -> None:
        try:
            self.graph, self.out = capture(self.ops.device, self._static_step)
        except RuntimeError as e:  # not capturable here: the steps run eagerly
            self.ops.graph_errors.append(f"drafter step: {e}")

    def draft(self, tok: int, h: Any, pos: int, n: int) -> list[int]:
        """n greedy drafts after token `tok` (at position `pos`) and the target's hidden state h (1, n_embd)."""
        st, ops = self.static, self.ops
        st.tokens.fill_(tok)
        st.positions.fill_(pos)
        st.kv_end.fill_(pos)  # the step reads the target's first pos positions
        self.h.copy_(ops.contiguous(h))
        ids = torch.empty(n, dtype=torch.int64, device=ops.device)
        for i in range(n):
            if self.graph is not None:
                self.graph.replay()
                assert self.out is not None
                am, nh = self.out
            elif ops.passes == "static":
                am, nh = self._static_step()
            else:
                am, nh = self._step(st.tokens, pos)
            ids[i : i + 1].copy_(am)
            if i + 1 < n:
                st.tokens.copy_(am)
                self.h.copy_(nh)
        return [int(t) for t in ops.host(ids)]
