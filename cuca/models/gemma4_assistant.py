"""`gemma4-assistant`: the multi-token-prediction drafter of Gemma 4. A small decoder (4 layers on E2B) whose
layers project only queries and attend to the target's own K/V cache (its last sliding and last full K/V-owning
layers); it owns no cache. One call: (token, target-width hidden, position) -> draft logits and the hidden state
for the next call.

ref: shared/specs/gemma4.md §3 (llama.cpp src/models/gemma4-assistant.cpp, transformers Gemma4AssistantForCausalLM).
Input is [target_embd(token) * sqrt(n_embd_target) ; h], embedding first; the head is the drafter's own token_embd
(no softcap): over the full vocabulary, or, when the file has `masked_embd_centroids.weight` and
`masked_embd_ordering` (the E2B/E4B assistants), over the ids of the top-scoring centroids only (CentroidHead).
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType

from ..errors import ProviderError
from ..gguf import GGUFFile
from ..sampling import top_ids
from .cache import KVCache
from .config import dim, opt
from .gemma4 import Config, QueryLayer, attn_spec, rope_freqs_of
from .gemma4 import Model as Target
from .layers import RESCORE, Attention, Linear, Ops, coarse_copy, linear, sandwich_residuals, vector
from .layers import requantize as to_q8_0


class Block(QueryLayer):
    def __init__(self, f: GGUFFile, c: Config, il: int, target: Target, rope_freqs: np.ndarray | None):
        self.kv_layer = target.c.kv_source(c.swa[il])  # the target's cache layer this layer reads
        # no K/V projections: the layer reads the target's
        attn = Attention(f, f"blk.{il}.", attn_spec(c, il, rope_freqs), self.kv_layer, owns_kv=False)
        super().__init__(f, c, il, attn)


def check_pair(f: GGUFFile, c: Config, n_embd_out: int, target: Target) -> None:
    """A drafter matches a target when widths, vocabulary and the K/V geometry it reads agree (names both values)."""
    t, where = target.c, f"drafter {f.path}"
    if n_embd_out != t.n_embd:
        raise ProviderError(
            f"{where}: embedding_length_out {n_embd_out} does not match the target's embedding_length {t.n_embd}"
        )
    if c.n_vocab != t.n_vocab:
        raise ProviderError(f"{where}: vocabulary of {c.n_vocab} tokens does not match the target's {t.n_vocab}")
    pairs = [("key_length", c.hd, t.hd), ("key_length_swa", c.hd_swa, t.hd_swa), ("sliding_window", c.window, t.window),
             ("rope.freq_base", c.rope_base, t.rope_base), ("rope.freq_base_swa", c.rope_base_swa, t.rope_base_swa)]
    for key, mine, theirs in pairs:
        if mine != theirs:
            raise ProviderError(f"{where}: {key} {mine} does not match the target's {theirs}")
    for il in range(c.n_layer):
        kv = t.kv_source(c.swa[il])
        if c.n_head[il] % t.n_head_kv[kv]:
            raise ProviderError(f"{where}: layer {il} has {c.n_head[il]} heads, not a multiple of the target's "
                                f"{t.n_head_kv[kv]} K/V heads")


DEFAULT_TOP_K = 32  # transformers' centroid_intermediate_top_k default, what the E2B and E4B assistants use


def centroid_layout(f: GGUFFile) -> tuple[int, int] | None:
    """(centroid count, top-k) when the drafter file has the centroid head's two tensors, None when it has neither;
    top-k from `centroid_intermediate_top_k` (typed, 1..centroids) or DEFAULT_TOP_K."""
    has = [n in f.tensors for n in ("masked_embd_centroids.weight", "masked_embd_ordering")]
    if has[0] != has[1]:
        raise ProviderError(f"{f.path}: has only one of masked_embd_centroids.weight and masked_embd_ordering")
    if not has[0]:
        return None
    n_c = int(f.tensor("masked_embd_centroids.weight").shape[0])
    return n_c, int(opt(f, "centroid_intermediate_top_k", int, min(DEFAULT_TOP_K, n_c), 1, n_c))


class CentroidHead:
    """transformers' Gemma4AssistantMaskedEmbedder: score the n_centroids centroids, keep the top_k, compute exact
    logits for their top_k * (n_vocab / n_centroids) token ids (masked_embd_ordering lists each centroid's ids) and
    fill every other id with min(selected) - 1, so that softmax, greedy and q_draft are HF's (HF takes that minimum
    over the whole batch, here it is per row: the same for the one-row steps drafting makes)."""

    def __init__(self, f: GGUFFile, token_embd: Linear, n_vocab: int, n_embd: int):
        layout = centroid_layout(f)
        if layout is None:
            raise ProviderError(f"{f.path}: no centroid head (masked_embd_centroids.weight, masked_embd_ordering)")
        n_c, self.top_k = layout
        ot = f.tensor("masked_embd_ordering")
        if ot.ggml_type != GGMLQuantizationType.I32 or ot.shape != (n_vocab,):
            raise ProviderError(f"{f.path}: masked_embd_ordering must be I32 of shape ({n_vocab},), got "
                                f"{ot.type_name} {ot.shape}")
        if n_vocab % n_c:
            raise ProviderError(f"{f.path}: {n_c} centroids do not divide the vocabulary of {n_vocab}")
        order = np.asarray(ot.data).view(np.int32).reshape(n_vocab)
        if np.any(np.bincount(np.clip(order, 0, n_vocab - 1), minlength=n_vocab) != 1) or order.min() < 0 or \
                order.max() >= n_vocab:
            raise ProviderError(f"{f.path}: masked_embd_ordering is not a permutation of the {n_vocab} token ids")
        self.centroids = linear(f, "masked_embd_centroids.weight", n_c, n_embd)
        self.groups = np.ascontiguousarray(order.reshape(n_c, n_vocab // n_c))  # centroid -> its token ids
        self.token_embd, self.n_vocab = token_embd, n_vocab

    def select(self, ops: Ops, zn: np.ndarray) -> np.ndarray:
        """(M, n_embd) -> the selected token ids per row, (M, top_k * ids per centroid), centroid by centroid."""
        return ops.top_groups(self.centroids(ops, zn), self.top_k, self.groups)

    def __call__(self, ops: Ops, zn: np.ndarray) -> np.ndarray:
        """Post-norm drafter state (M, n_embd) -> logits (M, n_vocab); the selected ids' logits come from the same
        matmul kernel as the dense head on the same rows (gathered), so they equal the dense head's there."""
        return ops.masked_logits(self.token_embd, self.select(ops, zn), zn, self.n_vocab)


class Assistant:
    arch = "gemma4-assistant"

    def __init__(self, f: GGUFFile, ops: Ops, target: Target, requantize: bool = True, coarse: bool | None = None):
        """Bind the drafter in `f` to `target`. `requantize` stores float matrices as Q8_0 (it only proposes);
        `coarse` (default: with `requantize`, where the backend's `coarse_draft_heads` says so) ranks a dense head's
        vocabulary with a Q4_0 copy of it (`logits`)."""
        if f.architecture != self.arch:
            raise ProviderError(f"{f.path}: architecture {f.architecture!r} is not a drafter ({self.arch!r} expected)")
        if getattr(target, "arch", None) != "gemma4":
            raise ProviderError(f"{f.path}: a {self.arch} drafter needs a gemma4 target, got "
                                f"{getattr(target, 'arch', type(target).__name__)!r}")
        self.c = c = Config.from_gguf(f)
        self.n_embd_out = dim(f, "embedding_length_out")
        n_nextn = int(opt(f, "nextn_predict_layers", int, c.n_layer))
        if n_nextn != c.n_layer:
            raise ProviderError(f"{f.path}: nextn_predict_layers {n_nextn} differs from block_count {c.n_layer}")
        check_pair(f, c, self.n_embd_out, target)
        self.ops, self.target = ops, target
        self.n_vocab = c.n_vocab
        self.rope_freqs = rope_freqs_of(f, c)
        self.token_embd = linear(f, "token_embd.weight", c.n_vocab, c.n_embd)
        self.output_norm = vector(f, "output_norm.weight", c.n_embd)
        self.pre_projection = linear(f, "nextn.pre_projection.weight", c.n_embd, 2 * self.n_embd_out)
        self.post_projection = linear(f, "nextn.post_projection.weight", self.n_embd_out, c.n_embd)
        self.blk = [Block(f, c, il, target, self.rope_freqs) for il in range(c.n_layer)]
        self.res = sandwich_residuals(self.blk, self.output_norm, c.eps)
        has_centroids = centroid_layout(f) is not None
        self.centroid_head = CentroidHead(f, self.token_embd, c.n_vocab, c.n_embd) if has_centroids else None
        if coarse is None:
            coarse = requantize and bool(getattr(ops, "coarse_draft_heads", False))
        # a dense head (no centroid head in the file, as llama.cpp's converter writes it) ranks with a Q4_0 copy:
        # 38 MB instead of 71 MB of Q8_0 for the 262,144 x 256 head (1.51 vs 2.57 ms from memory, AVX-512, 2 threads)
        self.coarse_embd = coarse_copy(self.token_embd) if coarse and self.centroid_head is None else None
        if requantize:
            for b in self.blk:
                to_q8_0(b)
            self.token_embd = self.token_embd.as_q8_0()
            self.pre_projection = self.pre_projection.as_q8_0()
            self.post_projection = self.post_projection.as_q8_0()
            if self.centroid_head is not None:
                self.centroid_head.centroids = self.centroid_head.centroids.as_q8_0()
                self.centroid_head.token_embd = self.token_embd

    def step(self, tokens: np.ndarray, h: np.ndarray, pos: int, cache: KVCache,
             greedy: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """tokens int32 (M,), h float32 (M, n_embd_target), all at position `pos`, reading the target cache's first
        `pos` positions -> (draft logits (M, n_vocab), next hidden (M, n_embd_target)); `greedy`: see `logits`."""
        c, ops, m = self.c, self.ops, tokens.shape[0]
        z = self.pre_projection(ops, ops.concat([self.target.embed(tokens), h], axis=1))
        positions = np.full(m, pos, np.int32)
        zn = ops.rms_norm(z, self.blk[0].attn_norm, c.eps)  # each layer's input norm, then output_norm's
        for b, (r_attn, r_mlp) in zip(self.blk, self.res, strict=True):
            q, _ = b.attn.query(ops, zn, positions)
            o = b.attn.attend(ops, q, positions, cache, n_kv=pos)  # M alternatives at one position
            zn = ops.residual(z, b.attn.output(ops, o, None), r_attn)
            zn = ops.residual(z, b.mlp(ops, zn), r_mlp)
        return self.logits(ops, zn, greedy), self.post_projection(ops, zn)

    def logits(self, ops: Ops, zn: np.ndarray, greedy: bool = True) -> np.ndarray:
        """Draft logits (M, n_vocab) of the post-norm state: the centroid head's, the dense head's, or with the
        coarse copy its logits (a sampled draft's q_draft; verification is exact for any q), and for a greedy draft
        the dense head's own values on the copy's RESCORE best ids (every other id their min - 1), so the arg-max
        is the dense head's wherever that is among them (ties: the lowest id, as over the whole row)."""
        if self.centroid_head is not None:
            return self.centroid_head(ops, zn)
        if self.coarse_embd is None:
            return self.token_embd(ops, zn)
        rough = self.coarse_embd(ops, zn)
        if not greedy:
            return rough
        ids = top_ids(rough, RESCORE)
        return ops.masked_logits(self.token_embd, ids, zn, self.n_vocab)


def load_assistant(f: GGUFFile, ops: Ops, target: object, requantize: bool = True,
                   coarse: bool | None = None) -> Assistant:
    """The drafter in `f` bound to `target`; ProviderError when `f` is no gemma4-assistant or does not match."""
    return ops.bind(Assistant(f, ops, target, requantize, coarse))  # type: ignore[arg-type]
