"""Architectures: one module per `general.architecture` (hyphens become underscores)."""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from ..errors import GGUFError, ProviderError
from ..gguf import GGUFFile
from .batch import SeqRows
from .cache import Cache
from .config import opt, req  # noqa: F401  (the typed reader, re-exported)
from .ops import Ops

ARCHITECTURES = ("llama", "gemma3", "gemma4", "qwen35", "qwen3", "qwen2")
DRAFTER_ARCHITECTURES = ("gemma4-assistant",)  # drafters only: they need a target to run


class Model(Protocol):
    arch: str
    n_vocab: int
    n_ctx_train: int

    def make_cache(self, n_ctx: int) -> Cache: ...

    def forward(
        self, tokens: np.ndarray, positions: np.ndarray, cache: Cache, logits: str = "last"
    ) -> np.ndarray: ...

    def forward_hidden(self, tokens: np.ndarray, positions: np.ndarray, cache: Cache) -> np.ndarray:
        """Hidden states after the final norm, (M, n_embd): what drafters that read the target consume."""

    def head(self, h: np.ndarray) -> np.ndarray:
        """Post-norm hidden (M, n_embd) -> logits (M, n_vocab), final softcap included."""

    def forward_batch(self, seqs: Sequence[SeqRows]) -> np.ndarray:
        """Rows of several sequences (each its own cache and positions) -> their post-norm hidden states in order."""


def load_model(f: GGUFFile, ops: Ops | None = None) -> Any:
    """Bind the weights of `f` to its architecture's Model (on the C backend no copies: weights stay memory-mapped;
    a device backend's `ops.bind` moves them to the device)."""
    from .dialects import check_dialect

    check_dialect(f)
    if f.architecture in DRAFTER_ARCHITECTURES:
        raise ProviderError(
            f"{f.path}: architecture {f.architecture!r} is a drafter, not a model to generate with: load its target "
            f"as the source and pass this file as the drafter (DrafterSource.file(...))"
        )
    if f.architecture not in ARCHITECTURES:
        raise ProviderError(
            f"{f.path}: architecture {f.architecture!r} is not supported (supported: {', '.join(ARCHITECTURES)})"
        )
    mod = importlib.import_module(f"{__name__}.{f.architecture.replace('-', '_')}")
    tokens, embd = f.get("tokenizer.ggml.tokens"), f.tensors.get("token_embd.weight")
    if isinstance(tokens, list) and embd is not None and len(tokens) > embd.shape[0]:  # would fail mid-request
        raise GGUFError(f"{f.path}: the vocabulary has {len(tokens)} tokens but token_embd.weight only "
                        f"{embd.shape[0]} rows")
    ops = ops or Ops()
    return ops.bind(mod.Model(f, ops))
