"""The error hierarchy. Every failure a user can cause is a CucaError subclass that names the culprit."""


class CucaError(Exception):
    """Base class of every error cuca raises on purpose."""


class ConfigError(CucaError):
    """A configuration value is invalid (names the field and the value)."""


class ProviderError(CucaError):
    """A model or drafter cannot be provided: incompatible pair, unsupported architecture, missing tensor."""


class GGUFError(ProviderError):
    """A GGUF file is malformed, truncated or inconsistent (names the file and the problem)."""


class SourceError(ProviderError):
    """A model source cannot be resolved or downloaded."""


class ContextLengthError(CucaError):
    """A request does not fit in the context window (names the sizes)."""


class TokenizerError(CucaError):
    """The tokenizer metadata is missing or unsupported, or a chat template fails to render."""
