"""Build the drafter a DrafterSource names, bound to a loaded target and its cache (one per model, reused by every
request: `begin` resets it)."""

from __future__ import annotations

import os
from typing import Any

from ...errors import ConfigError, ProviderError
from ...gguf import open_gguf
from ...models import DRAFTER_ARCHITECTURES
from ...models.layers import Ops
from ..source import DrafterSource
from . import Drafter
from .prompt_lookup import PromptLookupDrafter


def load_drafter(
    ds: DrafterSource, target: Any, cache: Any, ops: Ops, device: str = "cpu", target_path: str | os.PathLike[str] = ""
) -> Drafter:
    """The drafter for `target`; in-trunk means the model's MTP head, which keeps its own K/V cache.
    Errors: ConfigError for an in-trunk head off the CPU; ProviderError when the target has no prediction head, or a
    drafter file is not a drafter or does not match the target (names the values)."""
    if ds.kind == "prompt_lookup":
        return PromptLookupDrafter(ds.max_ngram)
    if ds.kind == "in_trunk":
        if device != "cpu":
            raise ConfigError(f"drafter: the in-trunk prediction head runs on the CPU only, not on device {device!r}")
        if getattr(target, "mtp", None) is None:
            raise ProviderError(
                f"drafter: {target_path} has no prediction head (architecture {target.arch!r}); the in-trunk drafter "
                f"needs a file with MTP/nextn tensors, e.g. qwen35 with blk.N.nextn.*"
            )
        from .mtp import MTPDrafter, check_in_trunk

        check_in_trunk(target, device)
        return MTPDrafter(target, cache.n_ctx, device)
    assert ds.source is not None
    path = ds.source.resolve()
    f = open_gguf(path)
    from ...models.dialects import check_dialect

    check_dialect(f)
    if f.architecture == "gemma4-assistant":
        from ...models.gemma4_assistant import load_assistant
        from .assistant import AssistantDrafter

        return AssistantDrafter(load_assistant(f, ops, target), cache)
    raise ProviderError(
        f"drafter {path}: architecture {f.architecture!r} is not a drafter file (drafter files: "
        f"{', '.join(DRAFTER_ARCHITECTURES)}; for a model with its own head use DrafterSource.IN_TRUNK)"
    )
