"""`TorchOps`: the `Ops` facade on torch tensors (float32 activations; weights in `wdtype`, dequantized at load).

Batch invariance: with `invariant` (the default on CPU tensors) every matmul and attention row is computed alone,
so a row's result never depends on the rows beside it and greedy speculation equals plain decoding bit for bit,
as on the C backend. On a GPU (`invariant` False) rows go through one batched matmul (cuBLAS picks kernels by
shape), which is what makes a verify pass cost about one decode step there; greedy identity is then reported, not
asserted (the product page's rule for a GPU device).

Static mode (`StaticInputs`, for CUDA graphs): the kernels read token ids and positions from device buffers set
before each replay, K/V rows are written at those positions, and attention covers the whole cache masked by
position, so no host value enters the graph.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from concurrent.futures import Executor, Future
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from ..device import Device
from ..models.ops import Mask, Ops, Rope
from ..quants import dequantize

CHUNK_BYTES = 64 << 20  # float32 host scratch per weight chunk while uploading


class StaticInputs:
    """Device buffers a captured pass reads instead of its host arguments: token ids, positions (M,) int64, the
    end of each row's keys `kv_end` (M,) (position + 1 in a model's pass, the position itself in a drafter step
    that reads the target's cache before it), and the rows of host-resident embedding tables for those tokens
    (all filled before each replay)."""

    def __init__(self, m: int, device: torch.device):
        self.tokens = torch.zeros(m, dtype=torch.int64, device=device)
        self.positions = torch.zeros(m, dtype=torch.int64, device=device)
        self.kv_end = torch.ones(m, dtype=torch.int64, device=device)
        self.host_rows: dict[str, torch.Tensor] = {}


class TorchOps(Ops):
    """Kernels on `device` with weights stored as `wdtype`; `threads` > 0 sets torch's CPU thread count."""

    requantize_drafters = False  # the product page's Q8_0 drafter is the CPU's choice
    coarse_draft_heads = False  # so is the drafters' Q4_0 ranking copy of the head
    relocatable_states = False  # captured graphs hold the recurrent states' addresses: a rollback copies into them
    deferred_states = False  # its deltanet writes per-token snapshots
    deltanet_chunk_min = 65  # long prefills as the chunked form's matrix products, not 65+ sequential steps

    def __init__(self, device: str | torch.device = "cpu", wdtype: torch.dtype = torch.float32, threads: int = 0,
                 invariant: bool | None = None, passes: str | None = None):
        super().__init__(threads)
        self.device = torch.device(device)
        # how passes of up to `pass_rows` rows run (graphs.py): "graph" (CUDA graphs, the default on a GPU), "static"
        # (the same static buffers, run eagerly: the CPU check of that path) or "eager" (no static buffers)
        self.passes = passes or ("graph" if self.device.type == "cuda" else "eager")
        if self.passes not in ("graph", "static", "eager") or (self.passes == "graph" and self.device.type != "cuda"):
            raise ValueError(f"passes must be 'graph' (CUDA only), 'static' or 'eager', got {self.passes!r}")
        self.pass_rows = 0  # the most rows a static pass takes (LocalModel: draft_tokens + 1); 0: none
        self.graph_errors: list[str] = []  # captures that failed (those passes then run eagerly): gpu_check shows them
        self.wdtype = wdtype
        self.invariant = self.device.type == "cpu" if invariant is None else invariant
        self.host_tables = frozenset({"per_layer_token_embd.weight"})  # Gemma 4's PLE table: rows gathered on host
        self.static: StaticInputs | None = None  # set while a pass is captured or replayed (graphs.py)
        self._rope: dict[int, tuple[Rope, torch.Tensor]] = {}
        if self.device.type == "cpu" and threads > 0:
            torch.set_num_threads(threads)

    @classmethod
    def for_device(cls, device: Device, index: int = 0, threads: int = 0) -> TorchOps:
        if device is Device.CUDA:
            torch.cuda.set_device(index)  # graph capture and its streams use the current device
            return cls(torch.device("cuda", index), torch.bfloat16, threads)
        return cls("cpu", torch.float32, threads)

    def available_memory(self) -> int | None:
        """Free bytes where the caches live: the GPU's, or None on CPU tensors (the host's rule applies)."""
        if self.device.type != "cuda":
            return None
        return int(torch.cuda.mem_get_info(self.device)[0])

    # ---- host <-> device -----------------------------------------------------------------------------------
    def tensor(self, a: Any) -> torch.Tensor:
        """A numpy array (or tensor) on the device: floats as float32 (float64 kept), integers as int64."""
        if isinstance(a, torch.Tensor):
            return a.to(self.device)
        a = np.asarray(a)
        dt = np.int64 if a.dtype.kind in "iub" else np.float64 if a.dtype == np.float64 else np.float32
        return torch.from_numpy(np.require(a, dt, ["C", "W"])).to(self.device)  # "W": torch wants writable

    def host(self, x: Any) -> np.ndarray:
        return x.detach().to("cpu").numpy() if isinstance(x, torch.Tensor) else np.asarray(x)

    def upload_weight(self, w: Any, wtype: int, shape: tuple[int, int], pool: Executor | None = None) -> torch.Tensor:
        """GGUF blocks (n_out rows) -> a (n_out, n_in) `wdtype` device tensor, dequantized (cuca.quants) chunk by
        chunk of CHUNK_BYTES float32, on `pool`'s threads when given (at most 2 chunks per thread in flight)."""
        n_out, n_in = shape
        dst = torch.empty(shape, dtype=self.wdtype, device=self.device)
        step = max(1, CHUNK_BYTES // (4 * n_in))

        def chunk(r0: int) -> tuple[int, np.ndarray]:
            n = min(step, n_out - r0)
            return r0, dequantize(w[r0 : r0 + n], wtype, n, n_in)

        def put(r0: int, rows: np.ndarray) -> None:
            dst[r0 : r0 + rows.shape[0]].copy_(torch.from_numpy(rows))

        starts = range(0, n_out, step)
        if pool is None:
            for r0 in starts:
                put(*chunk(r0))
            return dst
        window = 2 * getattr(pool, "_max_workers", 2)
        pending: deque[Future[tuple[int, np.ndarray]]] = deque()
        for r0 in starts:
            pending.append(pool.submit(chunk, r0))
            if len(pending) >= window:
                put(*pending.popleft().result())
        while pending:
            put(*pending.popleft().result())
        return dst

    def bind(self, model: Any) -> Any:
        from .bind import bind

        return bind(model, self)

    # ---- arrays ------------------------------------------------------------------------------------------
    def empty(self, shape: tuple[int, ...]) -> Any:
        return torch.empty(shape, dtype=torch.float32, device=self.device)

    def zeros(self, shape: tuple[int, ...]) -> Any:
        return torch.zeros(shape, dtype=torch.float32, device=self.device)

    def concat(self, parts: Sequence[Any], axis: int = 0) -> Any:
        return torch.cat([self._f32(p) for p in parts], dim=axis).contiguous()

    def contiguous(self, x: Any) -> Any:
        return self._f32(x).contiguous()

    def copy(self, x: Any) -> Any:
        return x.clone()

    def repeat_heads(self, x: Any, n: int) -> Any:
        return x.repeat(1, n, 1)

    def kv_cache(self, n_ctx: int, shapes: list[tuple[int, int, int]]) -> Any:
        from .bind import TorchKVCache

        return TorchKVCache(n_ctx, shapes, self)

    def snapshot_buffer(self, shape: tuple[int, ...]) -> Any:
        return self.empty(shape)

    def _f32(self, x: Any) -> torch.Tensor:
        t = x if isinstance(x, torch.Tensor) else self.tensor(x)
        return t if t.dtype == torch.float32 else t.float()

    def _ids(self, ids: Any) -> torch.Tensor:
        return self.static.tokens if self.static is not None else self.tensor(ids)

    def _positions(self, positions: Any) -> torch.Tensor:
        return self.static.positions if self.static is not None else self.tensor(positions)

    # ---- kernels ---------------------------------------------------------------------------------------------
    def _mm(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        if w.dtype == torch.float32:
            return F.linear(x, w)
        return F.linear(x.to(w.dtype), w).float()

    def matmul(self, w: Any, x: Any) -> Any:
        if not isinstance(w.w, torch.Tensor):
            raise TypeError(f"weight {w.name!r} is not on the device (bind the model to these Ops first)")
        x = self._f32(x)
        if self.invariant and x.shape[0] > 1:
            return torch.cat([self._mm(x[i : i + 1], w.w) for i in range(x.shape[0])])
        return self._mm(x, w.w)

    def get_rows(self, w: Any, ids: Any) -> Any:
        if isinstance(w.w, torch.Tensor):
            return w.w[self._ids(ids)].float()
        s = self.static  # a host-resident table: dequantize the rows on the host, then copy them over
        if s is not None and w.name in s.host_rows:
            return s.host_rows[w.name]
        return self.host_rows(w, ids)

    def host_rows(self, w: Any, ids: np.ndarray) -> torch.Tensor:
        """The dequantized rows `ids` of a host-resident table, on the device (filled into StaticInputs)."""
        idx = np.asarray(ids, np.int64)
        return self.tensor(dequantize(np.asarray(w.w)[idx], w.wtype, len(idx), w.n_in))

    def rowwise(self, fn: Any, *xs: torch.Tensor) -> torch.Tensor:
        """fn(*xs) computed on the first-axis rows one at a time when invariant: vectorized transcendental
        functions and reductions round an element differently in a SIMD body and a scalar tail, and where an element
        falls depends on how many rows there are."""
        if not self.invariant or xs[0].shape[0] <= 1:
            return fn(*xs)
        return torch.cat([fn(*(x[i : i + 1] for x in xs)) for i in range(xs[0].shape[0])])

    def rms_norm(self, x: Any, w: Any, eps: float, out: Any = None) -> Any:
        def norm(r: torch.Tensor) -> torch.Tensor:
            y = r * torch.rsqrt((r * r).mean(dim=-1, keepdim=True) + eps)
            return y if w is None else y * w

        y = self.rowwise(norm, self._f32(x))
        if out is None:
            return y
        out.copy_(y)
        return out

    def _inv_freq(self, r: Rope) -> torch.Tensor:
        hit = self._rope.get(id(r))
        if hit is None or hit[0] is not r:
            half = r.n_rot // 2
            inv = r.scale * np.float64(r.base) ** (-2.0 * np.arange(half, dtype=np.float64) / r.n_rot)
            if r.freq_factors is not None:
                inv = inv / np.asarray(r.freq_factors, np.float64)
            hit = self._rope[id(r)] = (r, torch.from_numpy(inv).to(self.device))
        return hit[1]

    def rope(self, x: Any, positions: Any, r: Rope) -> None:
        half = r.n_rot // 2
        if half == 0:
            return
        theta = self._positions(positions).to(torch.float64)[:, None] * self._inv_freq(r)[None, :]
        c = self.rowwise(torch.cos, theta).float()[:, None, :]
        s = self.rowwise(torch.sin, theta).float()[:, None, :]
        if r.neox:
            i0, i1 = slice(0, half), slice(half, r.n_rot)
        else:
            i0, i1 = slice(0, r.n_rot, 2), slice(1, r.n_rot, 2)
        x0, x1 = x[:, :, i0].clone(), x[:, :, i1]
        x[:, :, i0] = x0 * c - x1 * s
        x[:, :, i1] = x0 * s + x1 * c

    def act_mul(self, act: str, g: Any, u: Any, out: Any) -> Any:
        a = self.rowwise(F.silu if act == "silu" else _gelu, g)
        out.copy_(a * u)
        return out

    def silu(self, x: Any) -> Any:
        x.copy_(self.rowwise(F.silu, x))
        return x

    def attention(self, q: Any, kv: tuple[Any, Any], positions: Any, n_kv: int, mask: Mask) -> Any:
        kc, vc = kv
        m, h, d = q.shape
        hkv = kc.shape[0]
        st = self.static
        if st is not None:  # the whole cache, masked by position: no host value in the graph
            return self.rowwise(lambda qi, pi, ei: self._attend(qi, kc, vc, pi, mask, ei), q, st.positions, st.kv_end)
        pos = np.asarray(positions, np.int64)
        if not self.invariant:
            n = min(int(n_kv), kc.shape[1])
            end = torch.full((m,), n, dtype=torch.int64, device=self.device)
            return self._attend(q, kc[:, :n], vc[:, :n], self.tensor(pos), mask, end)
        out = self.empty((m, h, vc.shape[2]))
        for i in range(m):
            hi = min(int(pos[i]) + 1, int(n_kv))
            lo = max(0, int(pos[i]) - mask.window + 1) if mask.window > 0 else 0
            if hi <= lo:
                out[i] = 0.0
                continue
            qi = q[i].reshape(hkv, h // hkv, d)
            s = torch.bmm(qi, kc[:, lo:hi].transpose(1, 2)) * mask.scale
            out[i] = torch.bmm(torch.softmax(self._cap(s, mask.softcap), dim=-1), vc[:, lo:hi]).reshape(h, -1)
        return out

    def _attend(self, q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, pos: torch.Tensor, mask: Mask,
                end: torch.Tensor) -> torch.Tensor:
        """Every row of q against keys 0..n-1 of kc, masked per row: keys at or after `end` (M,), after the row's
        position, or outside its window."""
        m, h, d = q.shape
        hkv, n, _ = kc.shape
        g = h // hkv
        qh = q.reshape(m, hkv, g, d).permute(1, 2, 0, 3).reshape(hkv, g * m, d)
        s = self._cap(torch.bmm(qh, kc.transpose(1, 2)) * mask.scale, mask.softcap).view(hkv, g, m, n)
        j = torch.arange(n, device=q.device)[None, :]
        ok = (j <= pos[:, None]) & (j < end[:, None])
        if mask.window > 0:
            ok = ok & (j > pos[:, None] - mask.window)
        s = s.masked_fill(~ok, float("-inf"))
        p = torch.nan_to_num(torch.softmax(s, dim=-1), nan=0.0)  # a row with no key: zeros, as the C kernel
        o = torch.bmm(p.view(hkv, g * m, n), vc)
        return o.view(hkv, g, m, -1).permute(2, 0, 1, 3).reshape(m, h, -1)

    @staticmethod
    def _cap(s: torch.Tensor, cap: float) -> torch.Tensor:
        return cap * torch.tanh(s / cap) if cap > 0 else s

    def deltanet(self, qkv: tuple[Any, Any, Any], gates: tuple[Any, Any], state: Any, snaps: Any,
                 eps_scale: tuple[float, float]) -> Any:
        q, k, v = qkv
        g, beta = gates
        eps, scale = eps_scale
        s = state.clone()
        out = self.empty(v.shape)
        for t in range(q.shape[0]):  # token by token: each token's arithmetic is the same whatever T
            qt = q[t] * torch.rsqrt((q[t] * q[t]).sum(-1, keepdim=True) + eps) * scale
            kt = k[t] * torch.rsqrt((k[t] * k[t]).sum(-1, keepdim=True) + eps)
            s = s * torch.exp(g[t])[:, None, None]
            kv = torch.einsum("hi,hij->hj", kt, s)
            s = s + kt[:, :, None] * (beta[t][:, None] * (v[t] - kv))[:, None, :]
            out[t] = torch.einsum("hi,hij->hj", qt, s)
            if snaps is not None and t < q.shape[0] - 1:
                snaps[t] = s
        state.copy_(s)
        return out

    def deltanet_chunked(self, qkv: tuple[Any, Any, Any], gates: tuple[Any, Any], state: Any, out: Any,
                         scale: float, chunk: int = 64) -> None:
        """deltanet_state.gdn_chunked on tensors, in float64: per chunk of n tokens the intra-chunk part as one
        unit-lower-triangular solve, the state carried between chunks (no snapshots)."""
        from ..models.deltanet_state import L2_EPS

        q, k, v = (a.double() for a in qkv)
        g, beta = (a.double() for a in gates)
        q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + L2_EPS) * scale
        k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + L2_EPS)
        s = state.double()
        for c0 in range(0, q.shape[0], chunk):
            qc, kc, vc = (a[c0 : c0 + chunk].transpose(0, 1) for a in (q, k, v))  # (H, n, d)
            gc, bc = g[c0 : c0 + chunk].T, beta[c0 : c0 + chunk].T  # (H, n)
            n = qc.shape[1]
            cg = torch.cumsum(gc, dim=1)
            lower = torch.tril(torch.ones(n, n, dtype=torch.bool, device=q.device))
            gam = torch.where(lower, torch.exp(torch.where(lower, cg[:, :, None] - cg[:, None, :], 0.0)), 0.0)
            lmat = torch.tril(bc[:, :, None] * (kc @ kc.transpose(1, 2)) * gam, -1)
            lmat = lmat + torch.eye(n, dtype=lmat.dtype, device=q.device)
            eg = torch.exp(cg)[:, :, None]
            u = torch.linalg.solve_triangular(lmat, bc[:, :, None] * vc, upper=False, unitriangular=True)
            w = torch.linalg.solve_triangular(lmat, bc[:, :, None] * kc * eg, upper=False, unitriangular=True)
            vp = u - w @ s
            o = (qc * eg) @ s + ((qc @ kc.transpose(1, 2)) * gam) @ vp
            out[c0 : c0 + n] = o.transpose(0, 1).float()
            last = cg[:, -1]
            kd = kc * torch.exp(last[:, None] - cg)[:, :, None]  # each key decayed to the chunk's end
            s = torch.exp(last)[:, None, None] * s + kd.transpose(1, 2) @ vp
        state.copy_(s.float())

    def top_groups(self, scores: Any, k: int, groups: Any) -> Any:
        top = torch.topk(scores, k, dim=1).indices
        return groups[top].reshape(scores.shape[0], -1)

    def masked_logits(self, w: Any, ids: Any, x: Any, n_vocab: int) -> Any:
        out = self.empty((x.shape[0], n_vocab))
        for i in range(x.shape[0]):
            sel = self._mm(x[i : i + 1], w.w[ids[i]])[0]
            out[i] = sel.min() - 1.0
            out[i, ids[i]] = sel
        return out

    # ---- element-wise helpers of the hybrid layers -----------------------------------------------------------
    def sigmoid(self, x: Any) -> Any:
        return self.rowwise(torch.sigmoid, x)

    def decay(self, alpha: Any, a: Any, dt: Any) -> Any:
        return self.rowwise(lambda r: (a * F.softplus(r.double() + dt)).float(), alpha)

    def causal_conv(self, window: Any, x: Any, taps: Sequence[Any]) -> tuple[Any, Any]:
        m = x.shape[0]
        raw = torch.cat([window, x])
        out = raw[0:m] * taps[0]
        for j in range(1, len(taps)):
            out = out + raw[j : j + m] * taps[j]
        window.copy_(raw[m:])
        return out, raw

    def softcap(self, x: Any, cap: float) -> Any:
        if cap > 0:
            x.copy_(self.rowwise(lambda r: cap * torch.tanh(r / cap), x))
        return x


def _gelu(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")
