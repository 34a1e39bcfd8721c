"""Builds the one C extension, cuca.kernels._ckernels (its threads: pool.c, on pthreads).

CUCA_ISA picks the SIMD path, so every path can be built, tested and benchmarked on one machine:
  native (default): tuned for this CPU (-march=native; the AVX-512 kernels where it has them, else AVX2, else C);
  avx512: -march=native (this CPU must have the AVX-512 subsets the kernels use, qmatmul.h);
  avx2: -march=native with AVX-512 off (the AVX2 + FMA + F16C kernels);
  portable: no -march (the portable C kernels).
CUCA_NATIVE=0 (the older switch) means CUCA_ISA=portable. CUCA_PK_NTA=0 / 1 sets the packed kernels' weight
prefetch hint (packed.h; default: by the CPU). `cuca.kernels._ckernels.ISA` reports the path built.
"""

import os
from pathlib import Path

import numpy as np
from setuptools import Extension, setup

SRC = Path("cuca/kernels/src")
ISA_FLAGS = {"native": ["-march=native"], "avx512": ["-march=native"], "avx2": ["-march=native", "-mno-avx512f"],
             "portable": []}
native = os.environ.get("CUCA_NATIVE", "1") not in ("0", "false", "no", "off")
isa = os.environ.get("CUCA_ISA", "native" if native else "portable").strip().lower() or "native"
if isa not in ISA_FLAGS:
    raise SystemExit(f"CUCA_ISA={isa!r}: expected one of {', '.join(ISA_FLAGS)}")
cflags = ["-O3", "-std=c11", "-pthread", "-ffp-contract=off", "-fno-math-errno", "-Wall", "-Wno-unused-function",
          "-Werror=implicit-function-declaration"]
cflags += ISA_FLAGS[isa]
# the requested path, checked at compile time in isa.c (an avx512 build on a CPU without it fails there)
macros = [("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")] + ([("CUCA_ISA_WANT", isa)] if isa != "native" else [])
nta = os.environ.get("CUCA_PK_NTA", "").strip()
if nta:
    if nta not in ("0", "1"):
        raise SystemExit(f"CUCA_PK_NTA={nta!r}: expected 0 or 1")
    macros.append(("CUCA_PK_NTA", nta))

setup(
    ext_modules=[
        Extension(
            "cuca.kernels._ckernels",
            sources=sorted(str(p) for p in SRC.glob("*.c")),
            include_dirs=[str(SRC), np.get_include()],
            define_macros=macros,
            extra_compile_args=cflags,
            extra_link_args=["-pthread"],
            depends=[str(p) for p in SRC.glob("*.h")] + [str(p) for p in SRC.glob("*.inc")],
        )
    ]
)
