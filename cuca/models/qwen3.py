"""`qwen3`: the dense Qwen 3 decoder (0.6B-32B): the llama decoder with NeoX RoPE (base 1e6) and per-head RMS norms
of q and k before RoPE (attn_q_norm / attn_k_norm), no projection biases; small sizes tie the head.

ref: llama.cpp src/models/qwen3.cpp.
"""

from __future__ import annotations

from . import llama


class Model(llama.Model):
    arch = "qwen3"
    options = llama.Options(neox=True, qk_norm=True, rope_default=1e6)
