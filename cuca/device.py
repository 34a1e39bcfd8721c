"""Device: where a model runs, checked once when a LocalModelConfig is validated.

"cpu" is the C backend. "cuda" / "cuda:N" and "torch-cpu" run the PyTorch backend (cuca.gpu, the optional extra
`pip install "cuca[gpu]"`): on a CUDA GPU, or on CPU tensors (what the tests run the backend with, without a GPU).
"""

from __future__ import annotations

from enum import Enum

from .errors import ConfigError


class Device(str, Enum):
    """The devices a config may name. Vulkan and Metal are named so that a config asking for one gets the rule that
    applies (the in-trunk head: CPU only) before "not available"."""

    CPU = "cpu"
    CUDA = "cuda"
    TORCH_CPU = "torch-cpu"
    VULKAN = "vulkan"
    METAL = "metal"

    @classmethod
    def parse(cls, value: object) -> Device:
        """`value` as a Device ("cpu", "CPU", "cuda:1" or Device.CPU); anything else is a ConfigError naming
        `device`."""
        return cls.locate(value)[0]

    @classmethod
    def locate(cls, value: object) -> tuple[Device, int]:
        """(device, index): "cuda:N" gives (CUDA, N), any other name index 0."""
        if isinstance(value, cls):
            return value, 0
        if isinstance(value, str):
            name, colon, idx = value.strip().lower().partition(":")
            for d in cls:
                if d.value == name and (not colon or (d is Device.CUDA and idx.isdigit() and len(idx) <= 4)):
                    return d, int(idx or 0)
        raise ConfigError(f"device must be one of {', '.join(repr(d.value) for d in cls)} (or 'cuda:N'), "
                          f"got {value!r}")

    @property
    def torch(self) -> bool:
        """Whether this device runs the PyTorch backend."""
        return self in (Device.CUDA, Device.TORCH_CPU)

    @property
    def available(self) -> bool:
        return self is Device.CPU or (self.torch and missing(self, 0) is None)

    def check_available(self, index: int = 0) -> None:
        """ConfigError saying what is missing (PyTorch, a CUDA build, a visible GPU) unless the device can run."""
        if self is Device.CPU:
            return
        if not self.torch:
            raise ConfigError(f"device {self.value!r} is not available in this build (devices: 'cpu', 'cuda', "
                              f"'torch-cpu')")
        why = missing(self, index)
        if why is not None:
            raise ConfigError(f"device {self.value + (f':{index}' if index else '')!r}: {why}")


def missing(device: Device, index: int) -> str | None:
    """What the PyTorch backend lacks to run on `device` (None: nothing)."""
    try:
        import torch
    except ImportError:
        return "needs PyTorch, which is not installed (pip install \"cuca[gpu]\")"
    if device is Device.TORCH_CPU:
        return None
    if torch.version.cuda is None:
        return f"needs a CUDA build of PyTorch; torch {torch.__version__} has no CUDA support"
    if not torch.cuda.is_available():
        return "needs a CUDA GPU, and none is visible (torch.cuda.is_available() is False)"
    n = torch.cuda.device_count()
    if index >= n:
        return f"no CUDA device {index}: {n} visible"
    return None
