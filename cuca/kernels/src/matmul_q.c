/* Tile kernels for the 32-value block formats Q8_0, Q4_0, Q5_0 (against Q8_0 activations) and Q4_1, Q5_1
 * (against Q8_1 activations).
 *
 * Per block b the exact integer dot sumi_b = sum(code * a) is scaled by dw_b * da_b in float32 (plus mw_b * s_b
 * for the formats with a min). Weight codes enter the u8 x s8 dot instructions unsigned; the code offset (8, 16,
 * or 128 for Q8_0's sign flip) comes back through the activation correction c = -off * sum(a), which seeds the
 * integer accumulator.
 * AVX2: per group of 4 blocks, the pair sums of each block (maddubs, madd) folded by two horizontal adds into
 *   one vector (lane j and j + 4: block j), so the offset, scaling and accumulation run once per 4 blocks per x
 *   row, one accumulator per row; the weights of a group are unpacked once for every row of the tile.
 * Portable C: scalar, block by block.
 * Every tile size runs the same float sequence for each x row.
 * Where the build packs a format (cuca_pack_rows: Q4_0, Q8_0, Q4_1 (matmul_p.c) with AVX-512 or AVX2, Q5_0 and
 * Q5_1 with AVX-512), cuca_tile_q hands out the packed kernel on raw rows instead, so that packed and raw rows give
 * identical results: the AVX2 kernels here serve Q5_0 and Q5_1, the portable ones every format. */
#include "qmatmul.h"

#if defined(CUCA_AVX2)
#define QA_T 8
#else
#define QA_T 4
#endif

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

/* offsets of the 32 high bits and of the codes in a block */
#define QA_QH(wt) ((wt) == GT_Q5_0 ? 2 : 4)
#define QA_QS(wt) ((wt) == GT_Q8_0 ? 2 : (wt) == GT_Q4_0 ? 2 : (wt) == GT_Q4_1 ? 4 : (wt) == GT_Q5_0 ? 6 : 8)

#if defined(CUCA_AVX2)
/* 32 high bits -> bytes holding 0x10 where the bit is set */
static inline __m256i qa_bits16(uint32_t bits) {
    const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                            2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i sel = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), spread);
    v = _mm256_cmpeq_epi8(_mm256_and_si256(v, sel), sel);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x10));
}

/* fp16 at byte `off` of blocks 0..3 of a group (only the first nv exist) -> [f0 f1 f2 f3 f0 f1 f2 f3] */
static inline __attribute__((always_inline)) __m256 qa_half4(const int wt, const uint8_t *g, int nv, int off) {
    uint32_t h[4] = {0, 0, 0, 0};
    for (int j = 0; j < 4; j++)
        if (j < nv) h[j] = cuca_ld16(g + j * Q32_BYTES(wt) + off);
    const __m128 f = _mm_cvtph_ps(_mm_setr_epi32((int)(h[0] | h[1] << 16), (int)(h[2] | h[3] << 16), 0, 0));
    return _mm256_set_m128(f, f);
}

/* Blocks 4g .. 4g+3 of one weight row (the first nv exist): the codes of each block as unsigned bytes, and wd / wm = the blocks' d / m in the lanes of the group sums (lane j and j + 4). Unpacked
 * once per weight row and group, for every x row of the tile. */
static inline __attribute__((always_inline)) void qa_unpack4(const int wt, const uint8_t *g, int nv, __m256i *u,
                                                             __m256 *wd, __m256 *wm) {
    cuca_prefetch(g, 4 * Q32_BYTES(wt));
    for (int j = 0; j < 4; j++) {
        const uint8_t *blk = g + j * Q32_BYTES(wt);
        if (j >= nv) {
            u[j] = _mm256_setzero_si256();
        } else {
            const __m128i q = _mm_loadu_si128((const __m128i *)(blk + QA_QS(wt))), m4 = _mm_set1_epi8(0x0F);
            u[j] = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), m4), _mm_and_si128(q, m4));
            if (wt == GT_Q5_0 || wt == GT_Q5_1) u[j] = _mm256_or_si256(u[j], qa_bits16(cuca_ld32(blk + QA_QH(wt))));
        }
    }
    *wd = qa_half4(wt, g, nv, 0);
    *wm = Q32_HASMIN(wt) ? qa_half4(wt, g, nv, 2) : _mm256_setzero_ps();
}

/* qa_unpack4 for a whole group (the same vectors, fewer instructions: at M = 1 the unpacking was the kernel's
 * cost): a block's codes broadcast to both lanes and shifted per lane (low / high nibbles), and its first dword
 * (d, then m or the next bytes) converted for all 4 blocks at once, [d0 m0 d1 m1 ..], then spread to the lanes */
static inline __attribute__((always_inline)) void qa_unpack4_full(const int wt, const uint8_t *g, __m256i *u,
                                                                  __m256 *wd, __m256 *wm) {
    cuca_prefetch(g, 4 * Q32_BYTES(wt));
    const __m256i m4 = _mm256_set1_epi8(0x0F), sh = _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4);
    for (int j = 0; j < 4; j++) {
        const uint8_t *blk = g + j * Q32_BYTES(wt);
        const __m256i q = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(blk + QA_QS(wt))));
        u[j] = _mm256_and_si256(_mm256_srlv_epi32(q, sh), m4);
        if (wt == GT_Q5_0 || wt == GT_Q5_1) u[j] = _mm256_or_si256(u[j], qa_bits16(cuca_ld32(blk + QA_QH(wt))));
    }
    const int B = Q32_BYTES(wt);
    const __m256 f = _mm256_cvtph_ps(_mm_setr_epi32((int)cuca_ld32(g), (int)cuca_ld32(g + B), (int)cuca_ld32(g + 2 * B),
                                                    (int)cuca_ld32(g + 3 * B)));
    *wd = _mm256_permutevar8x32_ps(f, _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6));
    *wm = Q32_HASMIN(wt) ? _mm256_permutevar8x32_ps(f, _mm256_setr_epi32(1, 3, 5, 7, 1, 3, 5, 7)) : _mm256_setzero_ps();
}

/* One group for nr x rows: per block the exact pair sums (maddubs, madd), two horizontal adds leave lane j and
 * j + 4 = the halves of block j's sum; + c (code offset), * da, then acc += . * dw (+ wm * s). */
static inline __attribute__((always_inline)) void qa_group(const int wt, const __m256i *u, __m256 wd, __m256 wm,
                                                           int64_t g, const int nr, const cuca_act *A, int64_t m0,
                                                           __m256 *acc) {
    const __m256i ones = _mm256_set1_epi16(1);
    #pragma GCC unroll 17
    for (int r = 0; r < nr; r++) {
        const int8_t *q = ACT_QS(A, m0 + r) + 4 * QK * g;
        __m256i p[4];
        for (int j = 0; j < 4; j++)
            p[j] = _mm256_maddubs_epi16(u[j], _mm256_load_si256((const __m256i *)(q + QK * j)));
        /* pair sums folded in int16 before one widening: 8 pairs of codes <= 31 and |a| <= 128 stay below 2^15,
         * and integer sums are exact in any order (the same lanes as widening each block first) */
        __m256i ci = _mm256_madd_epi16(
            _mm256_hadd_epi16(_mm256_hadd_epi16(p[0], p[1]), _mm256_hadd_epi16(p[2], p[3])), ones);
        if (!Q32_HASMIN(wt)) /* the code offset's correction (Q4_1 / Q5_1 codes have none: c = 0) */
            ci = _mm256_add_epi32(ci, _mm256_load_si256((const __m256i *)(ACT_C(A, m0 + r) + 8 * g)));
        const __m256 f = _mm256_mul_ps(_mm256_cvtepi32_ps(ci), _mm256_load_ps(ACT_D(A, m0 + r) + 8 * g));
        acc[r] = _mm256_fmadd_ps(f, wd, acc[r]);
        if (Q32_HASMIN(wt)) acc[r] = _mm256_fmadd_ps(wm, _mm256_load_ps(ACT_S(A, m0 + r) + 8 * g), acc[r]);
    }
}

static inline __attribute__((always_inline)) void qa_tile(const int wt, const uint8_t *w, const cuca_act *A,
                                                          int64_t m0, const int nr, float *out, int64_t ldo) {
    const int64_t nb = A->n_in / QK, ng = (nb + 3) / 4;
    __m256 acc[QA_T];
    #pragma GCC unroll 17
    for (int r = 0; r < nr; r++) acc[r] = _mm256_setzero_ps();
    for (int64_t g = 0; g < ng; g++) {
        __m256i u[4];
        __m256 wd, wm;
        const int nv = nb - 4 * g < 4 ? (int)(nb - 4 * g) : 4;
        if (nv == 4) /* the whole group: no per-block checks */
            qa_unpack4_full(wt, w + g * 4 * Q32_BYTES(wt), u, &wd, &wm);
        else
            qa_unpack4(wt, w + g * 4 * Q32_BYTES(wt), nv, u, &wd, &wm);
        qa_group(wt, u, wd, wm, g, nr, A, m0, acc);
    }
    #pragma GCC unroll 17
    for (int r = 0; r < nr; r++) out[r * ldo] = cuca_hsum256(acc[r]);
}

#elif !defined(CUCA_AVX512) /* portable C (the AVX-512 build packs every format here: matmul_p.c) */
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

#if QA_T == 8
#define QA_FN(name, wt) CUCA_TILE_FN(name, qa_tile, wt, 8)
#else
#define QA_FN(name, wt) CUCA_TILE_FN(name, qa_tile, wt, 4)
#endif
#if !defined(CUCA_AVX512) && !defined(CUCA_AVX2) /* the SIMD builds pack Q8_0 and Q4_0 (cuca_tile_q) */
QA_FN(tile_q8_0, GT_Q8_0)
QA_FN(tile_q4_0, GT_Q4_0)
#endif
#if !defined(CUCA_AVX512) && !defined(CUCA_AVX2) /* the SIMD builds pack Q4_1 too */
QA_FN(tile_q4_1, GT_Q4_1)
#endif
#if !defined(CUCA_AVX512) /* AVX-512 packs Q5_0 / Q5_1 too */
QA_FN(tile_q5_0, GT_Q5_0)
QA_FN(tile_q5_1, GT_Q5_1)
#endif

int cuca_tile_q(int wtype, cuca_tile_fn *fn, int *tile) {
    if (cuca_pack_rows(wtype) > 0) return cuca_tile_p(wtype, NULL, fn, tile); /* bit-equal to the packed kernel */
    switch (wtype) {
#if !defined(CUCA_AVX512) && !defined(CUCA_AVX2)
    case GT_Q8_0: *fn = tile_q8_0; break;
    case GT_Q4_0: *fn = tile_q4_0; break;
#endif
#if !defined(CUCA_AVX512) && !defined(CUCA_AVX2)
    case GT_Q4_1: *fn = tile_q4_1; break;
#endif
#if !defined(CUCA_AVX512)
    case GT_Q5_0: *fn = tile_q5_0; break;
    case GT_Q5_1: *fn = tile_q5_1; break;
#endif
    default: return CUCA_EUNSUPPORTED;
    }
    *tile = QA_T;
    return CUCA_OK;
}
