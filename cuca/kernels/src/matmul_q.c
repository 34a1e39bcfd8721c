/* Tile kernels for the 32-value block formats Q8_0, Q4_0, Q5_0 (against Q8_0 activations) and Q4_1, Q5_1
 * (against Q8_1 activations).
 *
 * Per block b the exact integer dot sumi_b = sum(code * a) is scaled by dw_b * da_b in float32 (plus mw_b * s_b
 * for the formats with a min). Weight codes enter the u8 x s8 dot instructions unsigned; the code offset (8, 16,
 * or 128 for Q8_0's sign flip) comes back through the activation correction c = -off * sum(a), which seeds the
 * integer accumulator.
 * Portable C here: scalar, block by block, every tile size the same float sequence for each x row. The SIMD builds
 * pack all five formats (cuca_pack_rows, matmul_p.c), and cuca_tile_q hands out the packed kernel on raw rows, so
 * that packed and raw rows give identical results. */
#include "qmatmul.h"

#define QA_T 4 /* x rows per tile of the portable kernel (CUCA_TILE_FN's 4 below) */

int cuca_qa_offset(int wtype) {
#if defined(CUCA_AVX512)
    return wtype == GT_Q8_0 ? 128 : wtype == GT_Q4_0 ? 8 : wtype == GT_Q5_0 ? 16 : 0;
#elif defined(CUCA_AVX2)
    return wtype == GT_Q4_0 ? 8 : wtype == GT_Q5_0 ? 16 : 0;
#else
    (void)wtype;
    return 0;
#endif
}

#if !defined(CUCA_AVX512) && !defined(CUCA_AVX2) /* portable C (the SIMD builds pack every format here: matmul_p.c) */
static inline void qa_tile(const int wt, const uint8_t *w, const cuca_act *A, int64_t m0, const int nr, float *out,
                           int64_t ldo) {
    const int64_t nb = A->n_in / QK;
    float acc[QA_T] = {0};
    int32_t code[QK];
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = w + b * Q32_BYTES(wt);
        const float dw = cuca_h2f(cuca_ld16(blk)), mw = Q32_HASMIN(wt) ? cuca_h2f(cuca_ld16(blk + 2)) : 0.0f;
        cuca_codes_q(wt, blk, code);
        #pragma GCC unroll 8
        for (int r = 0; r < nr; r++) {
            const int8_t *a = ACT_QS(A, m0 + r) + QK * b;
            int32_t sumi = 0;
            for (int j = 0; j < QK; j++) sumi += code[j] * a[j];
            acc[r] += (dw * ACT_D(A, m0 + r)[QA_LANES * b]) * (float)sumi;
            if (Q32_HASMIN(wt)) acc[r] += mw * ACT_S(A, m0 + r)[QA_LANES * b];
        }
    }
    #pragma GCC unroll 8
    for (int r = 0; r < nr; r++) out[r * ldo] = acc[r];
}
#endif

#if !defined(CUCA_AVX512) && !defined(CUCA_AVX2)
#define QA_FN(name, wt) CUCA_TILE_FN(name, qa_tile, wt, 4)
QA_FN(tile_q8_0, GT_Q8_0)
QA_FN(tile_q4_0, GT_Q4_0)
QA_FN(tile_q4_1, GT_Q4_1)
QA_FN(tile_q5_0, GT_Q5_0)
QA_FN(tile_q5_1, GT_Q5_1)
#endif

int cuca_tile_q(int wtype, cuca_tile_fn *fn, int *tile) {
    if (cuca_pack_rows(wtype) > 0) return cuca_tile_p(wtype, NULL, fn, tile); /* bit-equal to the packed kernel */
#if !defined(CUCA_AVX512) && !defined(CUCA_AVX2)
    switch (wtype) {
    case GT_Q8_0: *fn = tile_q8_0; break;
    case GT_Q4_0: *fn = tile_q4_0; break;
    case GT_Q4_1: *fn = tile_q4_1; break;
    case GT_Q5_0: *fn = tile_q5_0; break;
    case GT_Q5_1: *fn = tile_q5_1; break;
    default: return CUCA_EUNSUPPORTED;
    }
    *tile = QA_T;
    return CUCA_OK;
#else
    (void)fn; (void)tile;
    return CUCA_EUNSUPPORTED;
#endif
}
