/* Tile kernels for the 32-value block formats Q8_0, Q4_0, Q5_0 (against Q8_0 activations) and Q4_1, Q5_1
 * (against Q8_1 activations).
 *
 * Per block b the exact integer dot sumi_b = sum(code * a) is scaled by dw_b * da_b in float32 (plus mw_b * s_b
 * for the formats with a min). Weight codes enter the u8 x s8 dot instructions unsigned; the code offset (8, 16,
 * or 128 for Q8_0's sign flip) comes back through the activation correction c = -off * sum(a), which seeds the
 * integer accumulator.
 * AVX-512: a zmm holds 4 blocks, 4 lanes each (two dpbusd cover the 32 values); the weight bytes are gathered
 *   with two-source byte permutes. Per x row and group of 4 blocks acc += (sumi lanes * da) * dw, alternating
 *   between two accumulators, then one fixed horizontal sum.
 * AVX2: per group of 4 blocks, the pair sums of each block (maddubs, madd) folded by two horizontal adds into
 *   one vector (lane j and j + 4: block j), so the offset, scaling and accumulation run once per 4 blocks per x
 *   row, one accumulator per row; the weights of a group are unpacked once for every row of the tile.
 * Portable C: scalar, block by block.
 * Every tile size runs the same float sequence for each x row.
 * Where the build packs a format (cuca_pack_rows: Q4_0, Q8_0, Q4_1 and Q6_K (matmul_p6.c, matmul_k.c) with AVX-512
 * or AVX2), cuca_tile_q hands out the packed kernel on raw rows instead, so that packed and raw rows give identical
 * results: the SIMD kernels here serve Q5_0 and Q5_1, the portable ones every format. */
#include "qmatmul.h"

#if defined(CUCA_AVX512)
#define QA_T 8
#elif defined(CUCA_AVX2)
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

/* block bytes; offsets of the 32 high bits and of the codes */
#define QA_BYTES(wt) ((wt) == GT_Q8_0 ? 34 : (wt) == GT_Q4_0 ? 18 : (wt) == GT_Q4_1 ? 20 : (wt) == GT_Q5_0 ? 22 : 24)
#define QA_HASMIN(wt) ((wt) == GT_Q4_1 || (wt) == GT_Q5_1)
#define QA_QH(wt) ((wt) == GT_Q5_0 ? 2 : 4)
#define QA_QS(wt) ((wt) == GT_Q8_0 ? 2 : (wt) == GT_Q4_0 ? 2 : (wt) == GT_Q4_1 ? 4 : (wt) == GT_Q5_0 ? 6 : 8)

/* Byte / word indices of the AVX-512 group unpacking (see qa_unpack4): for a group of 4 blocks loaded as
 * A = bytes [0, 64) and B = bytes [base, base + 64) (base = group bytes - 64),
 * tbl[0]: codes of each block, tbl[1]: Q5 high-bit words twice per block, tbl[2] / tbl[3]: fp16 d / m of block j repeated 4 times (words), tbl[4] / tbl[5]: bit selectors of
 * the low / high 16 values. */
void cuca_qa_tables(int wt, uint8_t tbl[6][64]) {
    const int bytes = QA_BYTES(wt), base = 4 * bytes - 64;
    memset(tbl, 0, 6 * 64);
    for (int j = 0; j < 4; j++)
        for (int t = 0; t < 16; t++) {
            const int i = 16 * j + t, e = bytes * j; /* block start */
            int p = e + QA_QS(wt) + t;
            tbl[0][i] = (uint8_t)(p < 64 ? p : 64 + p - base);
            p = e + QA_QH(wt) + (t & 3);
            tbl[1][i] = (uint8_t)(p < 64 ? p : 64 + p - base);
            tbl[4][i] = (uint8_t)t;
            tbl[5][i] = (uint8_t)(16 + t);
        }
    for (int j = 0; j < 4; j++)
        for (int u = 0; u < 4; u++)
            for (int k = 0; k < 2; k++)
                for (int h = 0; h < 2; h++) { /* byte h of d (k = 0) or m (k = 1) of block j, for lane 4j+u */
                    const int p = bytes * j + 2 * k + h;
                    tbl[2 + k][2 * (4 * j + u) + h] = (uint8_t)(p < 64 ? p : 64 + p - base);
                }
}

#if defined(CUCA_AVX512)
static inline float hsum512(__m512 v) {
    __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    b = _mm_add_ps(b, _mm_movehl_ps(b, b));
    b = _mm_add_ss(b, _mm_movehdup_ps(b));
    return _mm_cvtss_f32(b);
}

/* 64 bytes at p + off, bytes at or past `lim` read as zero (lim < 0: no limit) */
static inline __attribute__((always_inline)) __m512i ld64(const uint8_t *p, int off, int lim) {
    if (lim < 0) return _mm512_loadu_si512(p + off);
    const int n = lim - off;
    const __mmask64 m = n >= 64 ? ~(__mmask64)0 : n <= 0 ? 0 : (((__mmask64)1 << n) - 1);
    return _mm512_maskz_loadu_epi8(m, p + off);
}

/* Unpack a group of 4 blocks g (lim: valid bytes, -1 when all 4 exist) into unsigned codes
 * lo = [values 0..15 of each block], hi = [values 16..31 of each block], and [dw_j x4], [mw_j x4]. The byte
 * gathers are two-source permutes over two 64-byte loads (tables from cuca_qa_tables). */
static inline __attribute__((always_inline)) void qa_unpack4(const int wt, const uint8_t *g, int lim, const __m512i *t,
                                                             __m512i *lo, __m512i *hi, __m512 *wd, __m512 *wm) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const __m512i a = ld64(g, 0, lim), b = ld64(g, 4 * QA_BYTES(wt) - 64, lim);
    const __m512i z = _mm512_permutex2var_epi8(a, t[0], b);
    __m512i l = _mm512_and_si512(z, m4), h = _mm512_and_si512(_mm512_srli_epi16(z, 4), m4);
    if (wt == GT_Q5_0 || wt == GT_Q5_1) { /* qword 2j and 2j+1 = the 32 high bits of block j */
        const __m512i qh = _mm512_permutex2var_epi8(a, t[1], b), sixteen = _mm512_set1_epi8(16);
        l = _mm512_mask_add_epi8(l, _mm512_bitshuffle_epi64_mask(qh, t[4]), l, sixteen);
        h = _mm512_mask_add_epi8(h, _mm512_bitshuffle_epi64_mask(qh, t[5]), h, sixteen);
    }
    *lo = l;
    *hi = h;
    *wd = _mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_permutex2var_epi8(a, t[2], b)));
    *wm = QA_HASMIN(wt) ? _mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_permutex2var_epi8(a, t[3], b)))
                        : _mm512_setzero_ps();
}

/* per x row: its quantized values, corrections, scales (and Q8_1 sums), hoisted out of the block loop */
typedef struct { const int8_t *q; const int32_t *c; const float *d, *s; } qa_row;

/* blocks 4*gi .. 4*gi+3; lim as in qa_unpack4 */
static inline __attribute__((always_inline)) void qa_step(const int wt, const uint8_t *w, int64_t gi, int lim,
                                                          const __m512i *t, const int nr, const qa_row *R,
                                                          __m512 *acc) {
    __m512i lo, hi;
    __m512 wd, wm;
    cuca_prefetch(w + gi * 4 * QA_BYTES(wt), 4 * QA_BYTES(wt));
    qa_unpack4(wt, w + gi * 4 * QA_BYTES(wt), lim, t, &lo, &hi, &wd, &wm);
    #pragma GCC unroll 8
    for (int r = 0; r < nr; r++) {
        const int8_t *q = R[r].q + 4 * QK * gi;
        __m512i ci = _mm512_dpbusd_epi32(_mm512_load_si512(R[r].c + 16 * gi), lo, _mm512_load_si512(q));
        ci = _mm512_dpbusd_epi32(ci, hi, _mm512_load_si512(q + 64));
        const __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(ci), _mm512_load_ps(R[r].d + 16 * gi));
        acc[r] = _mm512_fmadd_ps(f, wd, acc[r]);
        if (QA_HASMIN(wt)) acc[r] = _mm512_fmadd_ps(wm, _mm512_load_ps(R[r].s + 16 * gi), acc[r]);
    }
}

static inline __attribute__((always_inline)) void qa_tile(const int wt, const uint8_t *w, const cuca_act *A,
                                                          int64_t m0, const int nr, float *out, int64_t ldo) {
    const int64_t nb = A->n_in / QK, ng = nb / 4;
    const __m512i *t = (const __m512i *)A->tbl;
    __m512 acc0[QA_T], acc1[QA_T];
    qa_row R[QA_T];
    int64_t gi = 0;
    #pragma GCC unroll 8
    for (int r = 0; r < nr; r++) {
        acc0[r] = acc1[r] = _mm512_setzero_ps();
        R[r] = (qa_row){ACT_QS(A, m0 + r), ACT_C(A, m0 + r), ACT_D(A, m0 + r), ACT_S(A, m0 + r)};
    }
    for (; gi + 1 < ng; gi += 2) {
        qa_step(wt, w, gi, -1, t, nr, R, acc0);
        qa_step(wt, w, gi + 1, -1, t, nr, R, acc1);
    }
    if (gi < ng) qa_step(wt, w, gi++, -1, t, nr, R, acc0);
    if (nb % 4) { /* the partial last group continues the alternation */
        if (ng & 1)
            qa_step(wt, w, gi, (int)(nb % 4) * QA_BYTES(wt), t, nr, R, acc1);
        else
            qa_step(wt, w, gi, (int)(nb % 4) * QA_BYTES(wt), t, nr, R, acc0);
    }
    #pragma GCC unroll 8
    for (int r = 0; r < nr; r++) out[r * ldo] = hsum512(_mm512_add_ps(acc0[r], acc1[r]));
}

#elif defined(CUCA_AVX2)
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
        if (j < nv) h[j] = cuca_ld16(g + j * QA_BYTES(wt) + off);
    const __m128 f = _mm_cvtph_ps(_mm_setr_epi32((int)(h[0] | h[1] << 16), (int)(h[2] | h[3] << 16), 0, 0));
    return _mm256_set_m128(f, f);
}

/* Blocks 4g .. 4g+3 of one weight row (the first nv exist): the codes of each block as unsigned bytes, and wd / wm = the blocks' d / m in the lanes of the group sums (lane j and j + 4). Unpacked
 * once per weight row and group, for every x row of the tile. */
static inline __attribute__((always_inline)) void qa_unpack4(const int wt, const uint8_t *g, int nv, __m256i *u,
                                                             __m256 *wd, __m256 *wm) {
    cuca_prefetch(g, 4 * QA_BYTES(wt));
    for (int j = 0; j < 4; j++) {
        const uint8_t *blk = g + j * QA_BYTES(wt);
        if (j >= nv) {
            u[j] = _mm256_setzero_si256();
        } else {
            const __m128i q = _mm_loadu_si128((const __m128i *)(blk + QA_QS(wt))), m4 = _mm_set1_epi8(0x0F);
            u[j] = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), m4), _mm_and_si128(q, m4));
            if (wt == GT_Q5_0 || wt == GT_Q5_1) u[j] = _mm256_or_si256(u[j], qa_bits16(cuca_ld32(blk + QA_QH(wt))));
        }
    }
    *wd = qa_half4(wt, g, nv, 0);
    *wm = QA_HASMIN(wt) ? qa_half4(wt, g, nv, 2) : _mm256_setzero_ps();
}

/* qa_unpack4 for a whole group (the same vectors, fewer instructions: at M = 1 the unpacking was the kernel's
 * cost): a block's codes broadcast to both lanes and shifted per lane (low / high nibbles), and its first dword
 * (d, then m or the next bytes) converted for all 4 blocks at once, [d0 m0 d1 m1 ..], then spread to the lanes */
static inline __attribute__((always_inline)) void qa_unpack4_full(const int wt, const uint8_t *g, __m256i *u,
                                                                  __m256 *wd, __m256 *wm) {
    cuca_prefetch(g, 4 * QA_BYTES(wt));
    const __m256i m4 = _mm256_set1_epi8(0x0F), sh = _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4);
    for (int j = 0; j < 4; j++) {
        const uint8_t *blk = g + j * QA_BYTES(wt);
        const __m256i q = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(blk + QA_QS(wt))));
        u[j] = _mm256_and_si256(_mm256_srlv_epi32(q, sh), m4);
        if (wt == GT_Q5_0 || wt == GT_Q5_1) u[j] = _mm256_or_si256(u[j], qa_bits16(cuca_ld32(blk + QA_QH(wt))));
    }
    const int B = QA_BYTES(wt);
    const __m256 f = _mm256_cvtph_ps(_mm_setr_epi32((int)cuca_ld32(g), (int)cuca_ld32(g + B), (int)cuca_ld32(g + 2 * B),
                                                    (int)cuca_ld32(g + 3 * B)));
    *wd = _mm256_permutevar8x32_ps(f, _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6));
    *wm = QA_HASMIN(wt) ? _mm256_permutevar8x32_ps(f, _mm256_setr_epi32(1, 3, 5, 7, 1, 3, 5, 7)) : _mm256_setzero_ps();
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
        if (!QA_HASMIN(wt)) /* the code offset's correction (Q4_1 / Q5_1 codes have none: c = 0) */
            ci = _mm256_add_epi32(ci, _mm256_load_si256((const __m256i *)(ACT_C(A, m0 + r) + 8 * g)));
        const __m256 f = _mm256_mul_ps(_mm256_cvtepi32_ps(ci), _mm256_load_ps(ACT_D(A, m0 + r) + 8 * g));
        acc[r] = _mm256_fmadd_ps(f, wd, acc[r]);
        if (QA_HASMIN(wt)) acc[r] = _mm256_fmadd_ps(wm, _mm256_load_ps(ACT_S(A, m0 + r) + 8 * g), acc[r]);
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
            qa_unpack4_full(wt, w + g * 4 * QA_BYTES(wt), u, &wd, &wm);
        else
            qa_unpack4(wt, w + g * 4 * QA_BYTES(wt), nv, u, &wd, &wm);
        qa_group(wt, u, wd, wm, g, nr, A, m0, acc);
    }
    #pragma GCC unroll 17
    for (int r = 0; r < nr; r++) out[r * ldo] = cuca_hsum256(acc[r]);
}

#else /* portable C */
static inline void qa_tile(const int wt, const uint8_t *w, const cuca_act *A, int64_t m0, const int nr, float *out,
                           int64_t ldo) {
    const int64_t nb = A->n_in / QK;
    float acc[QA_T] = {0};
    int32_t code[QK];
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = w + b * QA_BYTES(wt);
        const float dw = cuca_h2f(cuca_ld16(blk)), mw = QA_HASMIN(wt) ? cuca_h2f(cuca_ld16(blk + 2)) : 0.0f;
        cuca_codes_q(wt, blk, code);
        #pragma GCC unroll 8
        for (int r = 0; r < nr; r++) {
            const int8_t *a = ACT_QS(A, m0 + r) + QK * b;
            int32_t sumi = 0;
            for (int j = 0; j < QK; j++) sumi += code[j] * a[j];
            acc[r] += (dw * ACT_D(A, m0 + r)[QA_LANES * b]) * (float)sumi;
            if (QA_HASMIN(wt)) acc[r] += mw * ACT_S(A, m0 + r)[QA_LANES * b];
        }
    }
    #pragma GCC unroll 8
    for (int r = 0; r < nr; r++) out[r * ldo] = acc[r];
}
#endif

#if QA_T == 17
#define QA_FN(name, wt) CUCA_TILE_FN(name, qa_tile, wt, 17)
#elif QA_T == 8
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
QA_FN(tile_q5_0, GT_Q5_0)
QA_FN(tile_q5_1, GT_Q5_1)

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
    case GT_Q5_0: *fn = tile_q5_0; break;
    case GT_Q5_1: *fn = tile_q5_1; break;
    default: return CUCA_EUNSUPPORTED;
    }
    *tile = QA_T;
    return CUCA_OK;
}
