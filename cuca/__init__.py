"""cuca: fast, exact, in-process LLM inference on GGUF files."""

from .errors import ConfigError, CucaError, ProviderError
from .local import LocalModel, LocalModelConfig, Reply
from .remote import RemoteModel
from .sources import ModelSource
from .speculative.source import DrafterSource
from .speculative.stats import DraftStats

__version__ = "0.1.0"

__all__ = [
    "ConfigError",
    "CucaError",
    "DraftStats",
    "DrafterSource",
    "LocalModel",
    "LocalModelConfig",
    "ModelSource",
    "ProviderError",
    "RemoteModel",
    "Reply",
]
