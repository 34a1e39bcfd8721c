/* Tile kernels for the 32-element block formats Q8_0, Q4_0, Q5_0 (with Q8_0 activations) and Q4_1, Q5_1 (with
 * Q8_1 activations).
 *
 * Per block b the exact integer dot sumi_b = sum(code * a) is formed, then scaled by dw_b * da_b in float32
 * (plus mw_b * s_b for the formats with a min). Weight codes are fed unsigned to the u8 x s8 dot instructions;
 * the code offset (8, 16, or 128 for Q8_0's sign flip) comes back through the activation correction
 * c = -off * sum(a), which seeds the integer accumulator. Each x row gets the same float sequence in every
 * tile size: lane-wise products accumulated over block pairs into two alternating accumulators, then one
 * fixed horizontal sum. */
#include "qmatmul.h"

#if defined(CUCA_AVX512)
#if defined(__AVX512VNNI__)
#define DPBUSD(acc, u, s) _mm512_dpbusd_epi32((acc), (u), (s))
#else /* exact fallback: widen both operands to 16 bits */
static inline __m512i dpbusd_emu(__m512i acc, __m512i u, __m512i s) {
    const __m512i lo8 = _mm512_set1_epi16(0x00FF);
    __m512i ul = _mm512_and_si512(u, lo8), uh = _mm512_srli_epi16(u, 8);
    __m512i sl = _mm512_srai_epi16(_mm512_slli_epi16(s, 8), 8), sh = _mm512_srai_epi16(s, 8);
    return _mm512_add_epi32(acc, _mm512_add_epi32(_mm512_madd_epi16(ul, sl), _mm512_madd_epi16(uh, sh)));
}
#define DPBUSD(acc, u, s) dpbusd_emu((acc), (u), (s))
#endif
#define QA_T 8
#elif defined(CUCA_AVX2)
#define QA_T 4
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

/* block bytes; offsets of the fp16 min, of the 32 high bits, of the codes */
#define QA_BYTES(wt) ((wt) == GT_Q8_0 ? 34 : (wt) == GT_Q4_0 ? 18 : (wt) == GT_Q4_1 ? 20 : (wt) == GT_Q5_0 ? 22 : 24)
#define QA_HASMIN(wt) ((wt) == GT_Q4_1 || (wt) == GT_Q5_1)
#define QA_QH(wt) ((wt) == GT_Q5_0 ? 2 : 4)
#define QA_QS(wt) ((wt) == GT_Q8_0 ? 2 : (wt) == GT_Q4_0 ? 2 : (wt) == GT_Q4_1 ? 4 : (wt) == GT_Q5_0 ? 6 : 8)

#if defined(CUCA_AVX512)
static inline float hsum512(__m512 v) {
    __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    b = _mm_add_ps(b, _mm_movehl_ps(b, b));
    b = _mm_add_ss(b, _mm_movehdup_ps(b));
    return _mm_cvtss_f32(b);
}

/* Unpack blocks b0, b1 into 64 unsigned codes (natural order), [dw0 x8 | dw1 x8] and [mw0 x8 | mw1 x8]. */
static inline __attribute__((always_inline)) void qa_unpack(const int wt, const uint8_t *b0, const uint8_t *b1,
                                                            __m512i *wv, __m512 *wd, __m512 *wm) {
    if (wt == GT_Q8_0) {
        __m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(b0 + 2))),
                                       _mm256_loadu_si256((const __m256i *)(b1 + 2)), 1);
        *wv = _mm512_xor_si512(z, _mm512_set1_epi8((char)0x80));
    } else {
        const int qs = QA_QS(wt);
        __m256i l0 = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(b0 + qs)));
        __m256i l1 = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(b1 + qs)));
        __m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(l0), l1, 1);
        z = _mm512_mask_srli_epi16(z, 0xFF00FF00u, z, 4);
        z = _mm512_and_si512(z, _mm512_set1_epi8(0x0F));
        if (wt == GT_Q5_0 || wt == GT_Q5_1) {
            uint64_t hb = (uint64_t)cuca_ld32(b0 + QA_QH(wt)) | ((uint64_t)cuca_ld32(b1 + QA_QH(wt)) << 32);
            z = _mm512_mask_add_epi8(z, _cvtu64_mask64(hb), z, _mm512_set1_epi8(16));
        }
        *wv = z;
    }
    if (QA_HASMIN(wt)) {
        uint64_t h = (uint64_t)cuca_ld32(b0) | ((uint64_t)cuca_ld32(b1) << 32); /* d0 m0 d1 m1 */
        __m512 f = _mm512_castps128_ps512(_mm_cvtph_ps(_mm_cvtsi64_si128((long long)h)));
        *wd = _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 2, 2, 2, 2, 2, 2, 2, 2), f);
        *wm = _mm512_permutexvar_ps(_mm512_setr_epi32(1, 1, 1, 1, 1, 1, 1, 1, 3, 3, 3, 3, 3, 3, 3, 3), f);
    } else {
        uint32_t h = (uint32_t)cuca_ld16(b0) | ((uint32_t)cuca_ld16(b1) << 16);
        __m512 f = _mm512_castps128_ps512(_mm_cvtph_ps(_mm_cvtsi32_si128((int)h)));
        *wd = _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1), f);
        *wm = _mm512_setzero_ps();
    }
}

/* blocks b, b+1 (b+1 may be past the end: its activations are zero and its weight scales are masked) */
static inline __attribute__((always_inline)) void qa_step(const int wt, const uint8_t *w, int64_t nb, int64_t b,
                                                          const int nr, const cuca_act *A, int64_t m0,
                                                          __m512 *acc) {
    const uint8_t *b0 = w + b * QA_BYTES(wt);
    const int full = b + 1 < nb;
    __m512i wv;
    __m512 wd, wm;
    qa_unpack(wt, b0, full ? b0 + QA_BYTES(wt) : b0, &wv, &wd, &wm);
    if (!full) {
        wd = _mm512_maskz_mov_ps(0x00FF, wd);
        wm = _mm512_maskz_mov_ps(0x00FF, wm);
    }
    for (int r = 0; r < nr; r++) {
        __m512i ci = DPBUSD(_mm512_load_si512(ACT_C(A, m0 + r) + 8 * b), wv,
                            _mm512_load_si512(ACT_QS(A, m0 + r) + QK * b));
        __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(ci), _mm512_load_ps(ACT_D(A, m0 + r) + 8 * b));
        acc[r] = _mm512_fmadd_ps(f, wd, acc[r]);
        if (QA_HASMIN(wt)) acc[r] = _mm512_fmadd_ps(wm, _mm512_load_ps(ACT_S(A, m0 + r) + 8 * b), acc[r]);
    }
}

static inline __attribute__((always_inline)) void qa_tile(const int wt, const uint8_t *w, const cuca_act *A,
                                                          int64_t m0, const int nr, float *out, int64_t ldo) {
    const int64_t nb = A->n_in / QK;
    __m512 acc0[QA_T], acc1[QA_T];
    int64_t b = 0;
    for (int r = 0; r < nr; r++) acc0[r] = acc1[r] = _mm512_setzero_ps();
    for (; b + 3 < nb; b += 4) {
        qa_step(wt, w, nb, b, nr, A, m0, acc0);
        qa_step(wt, w, nb, b + 2, nr, A, m0, acc1);
    }
    if (b < nb) qa_step(wt, w, nb, b, nr, A, m0, acc0);
    if (b + 2 < nb) qa_step(wt, w, nb, b + 2, nr, A, m0, acc1);
    for (int r = 0; r < nr; r++) out[r * ldo] = hsum512(_mm512_add_ps(acc0[r], acc1[r]));
}

#elif defined(CUCA_AVX2)
static inline float hsum256(__m256 a) {
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    b = _mm_add_ps(b, _mm_movehl_ps(b, b));
    b = _mm_add_ss(b, _mm_movehdup_ps(b));
    return _mm_cvtss_f32(b);
}

/* 32 high bits -> bytes holding 0x10 where the bit is set */
static inline __m256i qa_bits16(uint32_t bits) {
    const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                            2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i sel = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), spread);
    v = _mm256_cmpeq_epi8(_mm256_and_si256(v, sel), sel);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x10));
}

static inline __attribute__((always_inline)) void qa_step2(const int wt, const uint8_t *blk, int64_t b, const int nr,
                                                           const cuca_act *A, int64_t m0, __m256 *acc) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i wv;
    __m256 wd = _mm256_set1_ps(cuca_h2f(cuca_ld16(blk))), wm = _mm256_setzero_ps();
    if (wt == GT_Q8_0) {
        wv = _mm256_loadu_si256((const __m256i *)(blk + 2));
    } else {
        __m128i q = _mm_loadu_si128((const __m128i *)(blk + QA_QS(wt)));
        const __m128i m4 = _mm_set1_epi8(0x0F);
        wv = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), m4), _mm_and_si128(q, m4));
        if (wt == GT_Q5_0 || wt == GT_Q5_1) wv = _mm256_or_si256(wv, qa_bits16(cuca_ld32(blk + QA_QH(wt))));
        if (QA_HASMIN(wt)) wm = _mm256_set1_ps(cuca_h2f(cuca_ld16(blk + 2)));
    }
    const __m256i wabs = wt == GT_Q8_0 ? _mm256_sign_epi8(wv, wv) : wv;
    for (int r = 0; r < nr; r++) {
        __m256i a = _mm256_load_si256((const __m256i *)(ACT_QS(A, m0 + r) + QK * b));
        if (wt == GT_Q8_0) a = _mm256_sign_epi8(a, wv);
        __m256i ci = _mm256_madd_epi16(_mm256_maddubs_epi16(wabs, a), ones);
        ci = _mm256_add_epi32(ci, _mm256_load_si256((const __m256i *)(ACT_C(A, m0 + r) + 8 * b)));
        __m256 f = _mm256_mul_ps(_mm256_cvtepi32_ps(ci), _mm256_load_ps(ACT_D(A, m0 + r) + 8 * b));
        acc[r] = _mm256_fmadd_ps(f, wd, acc[r]);
        if (QA_HASMIN(wt)) acc[r] = _mm256_fmadd_ps(wm, _mm256_load_ps(ACT_S(A, m0 + r) + 8 * b), acc[r]);
    }
}

static inline __attribute__((always_inline)) void qa_tile(const int wt, const uint8_t *w, const cuca_act *A,
                                                          int64_t m0, const int nr, float *out, int64_t ldo) {
    const int64_t nb = A->n_in / QK;
    __m256 acc0[QA_T], acc1[QA_T];
    int64_t b = 0;
    for (int r = 0; r < nr; r++) acc0[r] = acc1[r] = _mm256_setzero_ps();
    for (; b + 1 < nb; b += 2) {
        qa_step2(wt, w + b * QA_BYTES(wt), b, nr, A, m0, acc0);
        qa_step2(wt, w + (b + 1) * QA_BYTES(wt), b + 1, nr, A, m0, acc1);
    }
    if (b < nb) qa_step2(wt, w + b * QA_BYTES(wt), b, nr, A, m0, acc0);
    for (int r = 0; r < nr; r++) out[r * ldo] = hsum256(_mm256_add_ps(acc0[r], acc1[r]));
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
        for (int r = 0; r < nr; r++) {
            const int8_t *a = ACT_QS(A, m0 + r) + QK * b;
            int32_t sumi = 0;
            for (int j = 0; j < QK; j++) sumi += code[j] * a[j];
            acc[r] += (dw * ACT_D(A, m0 + r)[8 * b]) * (float)sumi;
            if (QA_HASMIN(wt)) acc[r] += mw * ACT_S(A, m0 + r)[8 * b];
        }
    }
    for (int r = 0; r < nr; r++) out[r * ldo] = acc[r];
}
#endif

#define QA_CASE(wt, n) case n: qa_tile(wt, w, A, m0, n, out, ldo); break
#if QA_T == 8
#define QA_DISPATCH(wt) switch (nr) { QA_CASE(wt, 1); QA_CASE(wt, 2); QA_CASE(wt, 3); QA_CASE(wt, 4); \
    QA_CASE(wt, 5); QA_CASE(wt, 6); QA_CASE(wt, 7); QA_CASE(wt, 8); default: break; }
#else
#define QA_DISPATCH(wt) switch (nr) { QA_CASE(wt, 1); QA_CASE(wt, 2); QA_CASE(wt, 3); QA_CASE(wt, 4); \
    default: break; }
#endif
#define QA_FN(name, wt) \
    static void name(const uint8_t *w, const cuca_act *A, int64_t m0, int nr, float *out, int64_t ldo) { \
        QA_DISPATCH(wt) \
    }
QA_FN(tile_q8_0, GT_Q8_0)
QA_FN(tile_q4_0, GT_Q4_0)
QA_FN(tile_q4_1, GT_Q4_1)
QA_FN(tile_q5_0, GT_Q5_0)
QA_FN(tile_q5_1, GT_Q5_1)

int cuca_tile_q(int wtype, cuca_tile_fn *fn, int *tile) {
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
}
