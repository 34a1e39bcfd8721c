"""DrafterSource: where draft tokens come from (a drafter GGUF, the model's own prediction head, prompt lookup)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import ClassVar

from ..errors import ConfigError
from ..sampling import is_int
from ..sources import ModelSource
from .drafters.prompt_lookup import MAX_NGRAM

KINDS = ("file", "in_trunk", "prompt_lookup", "auto")


@dataclass(frozen=True)
class DrafterSource:
    """`kind` is "file" (a drafter GGUF or a small model of the target's family at `source`), "in_trunk" (the
    target's own MTP head), "prompt_lookup" (n-grams up to `max_ngram`) or "auto" (resolved when the target is
    loaded: its in-trunk head if it has one, else its preset's paired drafter, else prompt lookup). Checked when
    built: a ConfigError names what is wrong."""

    kind: str
    source: ModelSource | None = None
    max_ngram: int = 3

    IN_TRUNK: ClassVar[DrafterSource]
    AUTO: ClassVar[DrafterSource]

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ConfigError(f"drafter kind must be one of {', '.join(map(repr, KINDS))}, got {self.kind!r}")
        if self.kind == "file" and not isinstance(self.source, ModelSource):
            raise ConfigError(f"drafter: a drafter file needs a ModelSource, got {self.source!r}")
        if self.kind != "file" and self.source is not None:
            raise ConfigError(f"drafter: kind {self.kind!r} reads no file, got source {self.source!r}")
        if not is_int(self.max_ngram) or not 1 <= self.max_ngram <= MAX_NGRAM:
            raise ConfigError(f"prompt_lookup max_ngram must be an integer in 1..{MAX_NGRAM}, got {self.max_ngram!r}")
        object.__setattr__(self, "max_ngram", int(self.max_ngram))  # a numpy integer becomes a plain int

    @classmethod
    def file(cls, source: ModelSource | str | os.PathLike[str]) -> DrafterSource:
        return cls("file", ModelSource.parse(source))

    @classmethod
    def prompt_lookup(cls, max_ngram: int = 3) -> DrafterSource:
        return cls("prompt_lookup", max_ngram=max_ngram)

    @classmethod
    def parse(cls, value: DrafterSource | ModelSource | str | os.PathLike[str]) -> DrafterSource:
        """A DrafterSource as is; "in-trunk" / "prompt-lookup" / "auto"; anything else is a drafter file's
        ModelSource."""
        if isinstance(value, DrafterSource):
            return value
        if isinstance(value, str) and value == "auto":
            return cls.AUTO
        if isinstance(value, str) and value.replace("_", "-") == "in-trunk":
            return cls.IN_TRUNK
        if isinstance(value, str) and value.replace("_", "-") == "prompt-lookup":
            return cls.prompt_lookup()
        return cls.file(value)


DrafterSource.IN_TRUNK = DrafterSource("in_trunk")
DrafterSource.AUTO = DrafterSource("auto")
