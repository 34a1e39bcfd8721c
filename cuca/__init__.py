"""cuca: fast, exact, in-process LLM inference on GGUF files."""

from .errors import ConfigError, CucaError, ProviderError
from .local import LocalModel, LocalModelConfig, Reply
from .sources import ModelSource

__version__ = "0.1.0"

__all__ = ["ConfigError", "CucaError", "LocalModel", "LocalModelConfig", "ModelSource", "ProviderError", "Reply"]
