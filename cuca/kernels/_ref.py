"""The numpy twins of every C kernel: same names, same signatures, same argument checks."""

from ._ref_matmul import *  # noqa: F403
from ._ref_matmul import __all__ as _matmul_all

try:
    from ._ref_ops import *  # noqa: F403
    from ._ref_ops import __all__ as _ops_all
except ImportError:  # pragma: no cover - the ops twins are optional while they are being written
    _ops_all = []

from ._ref_block import *  # noqa: E402, F403
from ._ref_block import __all__ as _block_all  # noqa: E402

__all__ = [*_matmul_all, *_ops_all, *_block_all]
