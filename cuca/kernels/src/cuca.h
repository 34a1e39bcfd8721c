/* Shared declarations of the cuca C kernels. Errors are returned as negative codes, never printed. */
#ifndef CUCA_H
#define CUCA_H
#include <stddef.h>
#include <stdint.h>

#define CUCA_OK 0
#define CUCA_EINVAL (-1)
#define CUCA_ENOMEM (-2)
#define CUCA_EUNSUPPORTED (-3)

/* Which SIMD path this build compiled: "avx512", "avx2" or "portable" (setup.py CUCA_ISA). */
const char *cuca_isa_name(void);

#endif
