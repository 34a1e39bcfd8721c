"""Build the drafter a DrafterSource names, bound to a loaded target and its cache (one per model, reused by every
request: `begin` resets it); what `auto` resolves to for a target; and the one rule that ties a drafter to a
device."""

from __future__ import annotations

import os
from typing import Any

from ...device import Device
from ...errors import ConfigError, ProviderError
from ...gguf import open_gguf
from ...models import ARCHITECTURES, DRAFTER_ARCHITECTURES, load_model
from ...models.layers import Ops
from ...sources import PRESETS, ModelSource, paired_drafter
from ...sources.presets import IN_TRUNK
from ...tokenizer import Tokenizer
from ..source import DrafterSource
from . import Drafter
from .prompt_lookup import PromptLookupDrafter


def check_device(ds: DrafterSource, device: Device) -> None:
    """ConfigError unless the drafter can run on `device`: the in-trunk prediction head runs on the CPU only."""
    if ds.kind == "in_trunk" and device is not Device.CPU:
        raise ConfigError(f"drafter: the in-trunk prediction head runs on the CPU only (device 'cpu', the C "
                          f"backend), not on device {device.value!r}")


def resolve_auto(ds: DrafterSource, target: Any, source: ModelSource | None = None,
                 device: Device = Device.CPU) -> DrafterSource:
    """`ds` itself unless it is "auto"; then the target's in-trunk head if it has one (on the CPU only), else the
    paired drafter of its preset (`source` a preset, or a path whose file name is a preset's), else prompt lookup."""
    if ds.kind != "auto":
        return ds
    if getattr(target, "mtp", None) is not None and device is Device.CPU:
        return DrafterSource.IN_TRUNK
    name = None
    if source is not None and source.kind == "preset":
        name = source.value
    elif source is not None and source.kind == "path":
        base = os.path.basename(source.value)
        name = next((p.name for p in PRESETS.values() if p.file and os.path.basename(p.file) == base), None)
    paired = paired_drafter(name) if name else None
    if paired is not None and paired != IN_TRUNK:
        return DrafterSource.file(ModelSource.preset(paired))
    return DrafterSource.prompt_lookup()


def load_drafter(
    ds: DrafterSource, target: Any, cache: Any, ops: Ops, target_path: str | os.PathLike[str] = ""
) -> Drafter:
    """The drafter for `target`; in-trunk means the model's MTP head, which keeps its own K/V cache; a file of an
    architecture cuca runs is a draft model (its own cache, the target's Ops), checked against the target's
    vocabulary (`target_path`'s) as llama.cpp checks a pair. Errors: ProviderError when the target has no prediction
    head (MTPDrafter says so), or a drafter file is not a drafter or does not match the target (names the values)."""
    if ds.kind == "prompt_lookup":
        return PromptLookupDrafter(ds.max_ngram)
    if ds.kind == "auto":
        raise ConfigError("drafter: resolve 'auto' for the target first (resolve_auto)")
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

        return AssistantDrafter(load_assistant(f, ops, target, ops.requantize_drafters), cache)
    if f.architecture in ARCHITECTURES:
        from .draft_model import DraftModelDrafter
        from .pairing import check_pairing

        if not target_path:
            raise ConfigError(f"drafter {path}: a draft model needs the target's file to check the pairing")
        check_pairing(Tokenizer.from_gguf(target_path), Tokenizer.from_gguf(f))
        return DraftModelDrafter(load_model(f, ops), cache.n_ctx, int(target.n_vocab))
    raise ProviderError(
        f"drafter {path}: architecture {f.architecture!r} is neither a drafter file "
        f"({', '.join(DRAFTER_ARCHITECTURES)}) nor a model cuca runs ({', '.join(ARCHITECTURES)}); for a model "
        f"with its own head use DrafterSource.IN_TRUNK"
    )
