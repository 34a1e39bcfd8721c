"""Build the drafter a DrafterSource names, bound to a loaded target and its cache (one per model, reused by every
request: `begin` resets it); and the one rule that ties a drafter to a device."""

from __future__ import annotations

import os
from typing import Any

from ...device import Device
from ...errors import ConfigError, ProviderError
from ...gguf import open_gguf
from ...models import DRAFTER_ARCHITECTURES
from ...models.layers import Ops
from ..source import DrafterSource
from . import Drafter
from .prompt_lookup import PromptLookupDrafter


def check_device(ds: DrafterSource, device: Device) -> None:
    """ConfigError unless the drafter can run on `device`: the in-trunk prediction head runs on the CPU only."""
    if ds.kind == "in_trunk" and device is not Device.CPU:
        raise ConfigError(f"drafter: the in-trunk prediction head runs on the CPU only, not on device "
                          f"{device.value!r}")


def load_drafter(
    ds: DrafterSource, target: Any, cache: Any, ops: Ops, target_path: str | os.PathLike[str] = ""
) -> Drafter:
    """The drafter for `target`; in-trunk means the model's MTP head, which keeps its own K/V cache.
    Errors: ProviderError when the target has no prediction head (MTPDrafter says so), or a drafter file is not a
    drafter or does not match the target (names the values)."""
    if ds.kind == "prompt_lookup":
        return PromptLookupDrafter(ds.max_ngram)
    if ds.kind == "in_trunk":
        from .mtp import MTPDrafter

        return MTPDrafter(target, cache.n_ctx, path=target_path)
    if ds.source is None:  # DrafterSource gives every "file" drafter a source
        raise ConfigError(f"drafter: kind {ds.kind!r} names no file")
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
