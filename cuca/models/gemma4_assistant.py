"""`gemma4-assistant`: the multi-token-prediction drafter of Gemma 4. A small decoder (4 layers on E2B) whose
layers project only queries and attend to the target's own K/V cache (its last sliding and last full K/V-owning
layers); it owns no cache. One call: (token, target-width hidden, position) -> draft logits and the hidden state
for the next call.

ref: shared/specs/gemma4.md §3 (llama.cpp src/models/gemma4-assistant.cpp, transformers Gemma4AssistantForCausalLM).
Input is [target_embd(token) * sqrt(n_embd_target) ; h], embedding first; the head is the drafter's own token_embd
(full vocabulary, no centroid masking, no softcap).
"""

from __future__ import annotations

import numpy as np

from ..errors import ProviderError
from ..gguf import GGUFFile
from .cache import KVCache
from .config import dim, opt
from .gemma4 import Config, QueryLayer, rope_freqs_of, sandwich_mlp
from .gemma4 import Model as Target
from .layers import Linear, Ops, head_norm, linear, rms_norm, vector


class Block(QueryLayer):
    def __init__(self, f: GGUFFile, c: Config, il: int, target: Target, rope_freqs: np.ndarray | None):
        super().__init__(f, c, il, rope_freqs)  # no K/V projections: the layer reads the target's
        self.kv_layer = target.c.kv_source(c.swa[il])  # the target's cache layer this layer reads

    def requantize(self) -> None:
        for name, v in vars(self).items():
            if isinstance(v, Linear):
                setattr(self, name, v.as_q8_0())


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


class Assistant:
    arch = "gemma4-assistant"

    def __init__(self, f: GGUFFile, ops: Ops, target: Target, requantize: bool = True):
        """Bind the drafter in `f` to `target`. `requantize` stores float matrices as Q8_0 (it only proposes)."""
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
        if requantize:
            for b in self.blk:
                b.requantize()
            self.token_embd = self.token_embd.as_q8_0()
            self.pre_projection = self.pre_projection.as_q8_0()
            self.post_projection = self.post_projection.as_q8_0()

    def step(self, tokens: np.ndarray, h: np.ndarray, pos: int, cache: KVCache) -> tuple[np.ndarray, np.ndarray]:
        """tokens int32 (M,), h float32 (M, n_embd_target), all at position `pos`, reading the target cache's first
        `pos` positions -> (draft logits (M, n_vocab), next hidden (M, n_embd_target))."""
        c, ops, m = self.c, self.ops, tokens.shape[0]
        x = np.concatenate([self.target.embed(tokens), h], axis=1)
        z = self.pre_projection(ops, np.ascontiguousarray(x, np.float32))
        positions = np.full(m, pos, np.int32)
        for b in self.blk:
            a = rms_norm(ops, z, b.attn_norm, c.eps)
            q = head_norm(ops, b.attn_q(ops, a).reshape(m, b.n_head, b.hd), b.attn_q_norm, c.eps)
            b.rope(ops, q, positions)
            kc, vc = cache.k[b.kv_layer], cache.v[b.kv_layer]
            o = np.empty((m, b.n_head, vc.shape[2]), np.float32)
            ops.k.attention(q, kc, vc, positions, pos, b.window, 1.0, 0.0, o, ops.threads)
            z += rms_norm(ops, b.attn_output(ops, o.reshape(m, -1)), b.post_attention_norm, c.eps)
            sandwich_mlp(ops, b, z, c.eps)
            z *= b.out_scale
        zn = rms_norm(ops, z, self.output_norm, c.eps)
        return self.token_embd(ops, zn), self.post_projection(ops, zn)


def load_assistant(f: GGUFFile, ops: Ops, target: object, requantize: bool = True) -> Assistant:
    """The drafter in `f` bound to `target`; ProviderError when `f` is no gemma4-assistant or does not match."""
    return Assistant(f, ops, target, requantize)  # type: ignore[arg-type]
