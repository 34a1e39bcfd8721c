"""Device: where a model runs, checked once when a LocalModelConfig is validated."""

from __future__ import annotations

from enum import Enum

from .errors import ConfigError


class Device(str, Enum):
    """The devices a config may name. Only the CPU is available in this build; the others are named so that a
    config asking for one gets the rule that applies (the in-trunk head: CPU only) before "not available"."""

    CPU = "cpu"
    CUDA = "cuda"
    VULKAN = "vulkan"
    METAL = "metal"

    @classmethod
    def parse(cls, value: object) -> Device:
        """`value` as a Device ("cpu", "CPU" or Device.CPU); anything else is a ConfigError naming `device`."""
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            for d in cls:
                if d.value == value.strip().lower():
                    return d
        raise ConfigError(f"device must be one of {', '.join(repr(d.value) for d in cls)}, got {value!r}")

    @property
    def available(self) -> bool:
        return self is Device.CPU

    def check_available(self) -> None:
        if not self.available:
            raise ConfigError(f"device {self.value!r} is not available in this build (only 'cpu')")
