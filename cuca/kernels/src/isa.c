/* Which SIMD path this build compiled (setup.py's CUCA_ISA): the same tests as qmatmul.h's CUCA_AVX512 /
 * CUCA_AVX2, so the name reported is the path the matmul kernels took. */
#include "qmatmul.h"

#define CUCA_ISA_avx512 1
#define CUCA_ISA_avx2 2
#define CUCA_ISA_portable 3
#define CUCA_CAT_(a, b) a##b
#define CUCA_CAT(a, b) CUCA_CAT_(a, b)

#if defined(CUCA_AVX512)
#define CUCA_ISA_BUILT CUCA_ISA_avx512
#elif defined(CUCA_AVX2)
#define CUCA_ISA_BUILT CUCA_ISA_avx2
#else
#define CUCA_ISA_BUILT CUCA_ISA_portable
#endif

#if defined(CUCA_ISA_WANT) && CUCA_CAT(CUCA_ISA_, CUCA_ISA_WANT) != CUCA_ISA_BUILT
#error "CUCA_ISA asks for a SIMD path that this compiler/CPU cannot build (see qmatmul.h for the flags each needs)"
#endif

const char *cuca_isa_name(void) {
#if CUCA_ISA_BUILT == CUCA_ISA_avx512
    return "avx512";
#elif CUCA_ISA_BUILT == CUCA_ISA_avx2
    return "avx2";
#else
    return "portable";
#endif
}
