"""The PyTorch backend of `Ops` (optional: `pip install "cuca[gpu]"`): models run on a CUDA GPU ("cuda", "cuda:N")
or on CPU tensors ("torch-cpu", what the tests use without a GPU). Nothing here is imported unless such a device is
asked for, so cuca never depends on torch.

- `TorchOps` (ops.py): the kernels and array helpers on torch tensors, float32 activations; weights dequantized at
  load from their GGUF blocks (cuca.quants) to bf16 on a GPU, float32 on CPU tensors.
- `bind` (bind.py): a model's weights to the device tensor by tensor (bounded host memory; Gemma 4's per-layer
  embedding table stays in host memory), and the host-facing view the engine and drafters use (numpy in and out).
- `graphs.py`: the decode step and verify passes for each M captured as CUDA graphs with static buffers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..device import Device

if TYPE_CHECKING:
    from .ops import TorchOps


def make_ops(device: Device, index: int = 0, threads: int = 0) -> TorchOps:
    """The TorchOps for a checked torch device (Device.check_available passed)."""
    from .ops import TorchOps

    return TorchOps.for_device(device, index, threads)
