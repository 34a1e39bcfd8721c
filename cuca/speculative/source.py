"""DrafterSource: where draft tokens come from (a drafter GGUF, the model's own prediction head, prompt lookup)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import ClassVar

from ..errors import ConfigError
from ..sampling import is_int
from ..sources import ModelSource
from .drafters.prompt_lookup import MAX_NGRAM


@dataclass(frozen=True)
class DrafterSource:
    """`kind` is "file" (a separate drafter GGUF), "in_trunk" (the target's own MTP head) or "prompt_lookup"."""

    kind: str
    source: ModelSource | None = None
    max_ngram: int = 3

    IN_TRUNK: ClassVar[DrafterSource]

    @classmethod
    def file(cls, source: ModelSource | str | os.PathLike[str]) -> DrafterSource:
        return cls("file", ModelSource.parse(source))

    @classmethod
    def prompt_lookup(cls, max_ngram: int = 3) -> DrafterSource:
        if not is_int(max_ngram) or not 1 <= max_ngram <= MAX_NGRAM:
            raise ConfigError(f"prompt_lookup max_ngram must be an integer in 1..{MAX_NGRAM}, got {max_ngram!r}")
        return cls("prompt_lookup", max_ngram=int(max_ngram))

    @classmethod
    def parse(cls, value: DrafterSource | ModelSource | str | os.PathLike[str]) -> DrafterSource:
        """A DrafterSource as is; "in-trunk" / "prompt-lookup"; anything else is a drafter file's ModelSource."""
        if isinstance(value, DrafterSource):
            return value
        if isinstance(value, str) and value.replace("_", "-") == "in-trunk":
            return cls.IN_TRUNK
        if isinstance(value, str) and value.replace("_", "-") == "prompt-lookup":
            return cls.prompt_lookup()
        return cls.file(value)


DrafterSource.IN_TRUNK = DrafterSource("in_trunk")
