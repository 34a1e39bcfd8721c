"""Builds the one C extension, cuca.kernels._ckernels, with OpenMP.

CUCA_NATIVE=0 builds without -march=native (portable C paths only); the default tunes for this CPU.
"""

import os
from pathlib import Path

import numpy as np
from setuptools import Extension, setup

SRC = Path("cuca/kernels/src")
native = os.environ.get("CUCA_NATIVE", "1") not in ("0", "false", "no", "off")
cflags = ["-O3", "-std=c11", "-fopenmp", "-ffp-contract=off", "-fno-math-errno", "-Wall", "-Wno-unused-function"]
if native:
    cflags.append("-march=native")

setup(
    ext_modules=[
        Extension(
            "cuca.kernels._ckernels",
            sources=sorted(str(p) for p in SRC.glob("*.c")),
            include_dirs=[str(SRC), np.get_include()],
            define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
            extra_compile_args=cflags,
            extra_link_args=["-fopenmp"],
            depends=[str(p) for p in SRC.glob("*.h")] + [str(p) for p in SRC.glob("*.inc")],
        )
    ]
)
