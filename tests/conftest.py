"""Shared test helpers: where the real PyPI-shipped models live."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cuca.errors import SourceError
from cuca.sources import ModelSource

PRESETS = {"smollm2": "smollm2-135m-instruct-q4_1", "gemma3": "gemma3-270m-q4_k_m"}


def real_model_path(name: str) -> Path:
    """The GGUF of a real model by short name; skipped when its package is not installed, except under CI
    (CUCA_REQUIRE_REAL_MODELS=1), where a missing model is a failure rather than a silent skip."""
    try:
        return ModelSource.parse(PRESETS[name]).resolve()
    except SourceError as e:
        if os.environ.get("CUCA_REQUIRE_REAL_MODELS") == "1":
            raise
        pytest.skip(str(e))
