"""`qwen2`: the Qwen 2 / 2.5 decoder: the llama decoder with NeoX RoPE (base 1e6) and biases on the q, k and v
projections (`attn_{q,k,v}.bias`, which the shared Attention adds where a file has them); small sizes tie the head.

ref: llama.cpp src/models/qwen2.cpp.
"""

from __future__ import annotations

from . import llama


class Model(llama.Model):
    arch = "qwen2"
    options = llama.Options(neox=True, rope_default=1e6)
