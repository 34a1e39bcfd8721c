/* Tile kernels for the 256-element K formats Q4_K, Q5_K, Q6_K against Q8_K activations.
 *
 * Per superblock the integer sum  sumi = sum_j scale_j * sum(code * a)  is exact (u8 x s8 pair products, then
 * 16-bit scales into 32-bit lanes); Q6_K's code offset 32 enters through the activation block sums
 * (-32 * scale_k * bsum_k), and Q4_K/Q5_K's mins through  summ = sum_k min_(k/2) * bsum_k. Then, in float32,
 * acc += (sumi lanes * da) * dw  and  accm += (summ lanes * da) * dmin,  result = hsum(acc) - hsum(accm), the
 * same sequence for each x row in every tile size. */
#include "qmatmul.h"

#define QKB(wt) ((wt) == GT_Q4_K ? 144 : (wt) == GT_Q5_K ? 176 : 210)

#if defined(CUCA_AVX512)
#define QK_T 8
#if defined(__AVX512VNNI__)
#define DPWSSD(acc, a, b) _mm512_dpwssd_epi32((acc), (a), (b))
#else
#define DPWSSD(acc, a, b) _mm512_add_epi32((acc), _mm512_madd_epi16((a), (b)))
#endif
#else
#define QK_T 4
#endif

/* Does the activation buffer store each superblock's 32-groups in the order 0 2 1 3 4 6 5 7? */
int cuca_qk_perm(int wtype) {
#if defined(CUCA_AVX512)
    return wtype == GT_Q4_K || wtype == GT_Q5_K;
#else
    (void)wtype;
    return 0;
#endif
}

#if defined(CUCA_AVX512)
static inline float hsum512(__m512 v) {
    __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    b = _mm_add_ps(b, _mm_movehl_ps(b, b));
    b = _mm_add_ss(b, _mm_movehdup_ps(b));
    return _mm_cvtss_f32(b);
}

static inline __m512i dup2x32(char lo, char hi) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi8(lo)), _mm256_set1_epi8(hi), 1);
}

typedef struct {
    __m512i u[4], v[4], c; /* codes (u8), 16-bit scales per code pair, 16-bit factors for the bsums */
    __m512 d, dm;
} kblock;

static inline __attribute__((always_inline)) void k_unpack(const int wt, const uint8_t *b, kblock *k) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    if (wt == GT_Q6_K) {
        const uint8_t *ql = b, *qh = b + 128;
        const __m512i mlo = dup2x32(0x03, 0x0C), mhi = dup2x32(0x30, (char)0xC0);
        const __m512i slo = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(2), 1);
        const __m512i shi = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
        for (int h = 0; h < 2; h++) {
            __m512i L = _mm512_loadu_si512(ql + 64 * h);
            __m512i H = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(qh + 32 * h)));
            __m512i lo = _mm512_and_si512(L, m4), hi = _mm512_and_si512(_mm512_srli_epi16(L, 4), m4);
            k->u[2 * h] = _mm512_or_si512(lo, _mm512_sllv_epi16(_mm512_and_si512(H, mlo), slo));
            k->u[2 * h + 1] = _mm512_or_si512(hi, _mm512_srlv_epi16(_mm512_and_si512(H, mhi), shi));
        }
        __m512i s = _mm512_castsi256_si512(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(b + 192))));
        for (int j = 0; j < 4; j++) {
            const __m512i idx = _mm512_inserti64x4(
                _mm512_castsi256_si512(_mm256_setr_epi16(4 * j, 4 * j, 4 * j, 4 * j, 4 * j, 4 * j, 4 * j, 4 * j,
                    4 * j + 1, 4 * j + 1, 4 * j + 1, 4 * j + 1, 4 * j + 1, 4 * j + 1, 4 * j + 1, 4 * j + 1)),
                _mm256_setr_epi16(4 * j + 2, 4 * j + 2, 4 * j + 2, 4 * j + 2, 4 * j + 2, 4 * j + 2, 4 * j + 2,
                    4 * j + 2, 4 * j + 3, 4 * j + 3, 4 * j + 3, 4 * j + 3, 4 * j + 3, 4 * j + 3, 4 * j + 3, 4 * j + 3),
                1);
            k->v[j] = _mm512_permutexvar_epi16(idx, s);
        }
        k->c = _mm512_zextsi256_si512(_mm256_sub_epi16(_mm256_setzero_si256(),
                                                       _mm256_slli_epi16(_mm512_castsi512_si256(s), 5)));
        k->d = _mm512_set1_ps(cuca_h2f(cuca_ld16(b + 208)));
        k->dm = _mm512_setzero_ps();
        return;
    }
    const uint8_t *qs = b + (wt == GT_Q5_K ? 48 : 16);
    __m512i z0 = _mm512_loadu_si512(qs), z1 = _mm512_loadu_si512(qs + 64);
    k->u[0] = _mm512_and_si512(z0, m4); /* groups 0 | 2 */
    k->u[1] = _mm512_and_si512(_mm512_srli_epi16(z0, 4), m4); /* 1 | 3 */
    k->u[2] = _mm512_and_si512(z1, m4); /* 4 | 6 */
    k->u[3] = _mm512_and_si512(_mm512_srli_epi16(z1, 4), m4); /* 5 | 7 */
    if (wt == GT_Q5_K) {
        const __m512i H = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(b + 16)));
        const __m512i sixteen = _mm512_set1_epi8(16);
        const char bit[4][2] = {{0x01, 0x04}, {0x02, 0x08}, {0x10, 0x40}, {0x20, (char)0x80}};
        for (int j = 0; j < 4; j++) {
            __mmask64 m = _mm512_test_epi8_mask(H, dup2x32(bit[j][0], bit[j][1]));
            k->u[j] = _mm512_mask_add_epi8(k->u[j], m, k->u[j], sixteen);
        }
    }
    uint64_t sc, mn;
    k4_scales(b + 4, &sc, &mn);
    __m512i s = _mm512_castsi256_si512(_mm256_cvtepu8_epi16(_mm_set_epi64x((long long)mn, (long long)sc)));
    const short g[4][2] = {{0, 2}, {1, 3}, {4, 6}, {5, 7}};
    for (int j = 0; j < 4; j++)
        k->v[j] = _mm512_permutexvar_epi16(
            _mm512_inserti64x4(_mm512_set1_epi16(g[j][0]), _mm256_set1_epi16(g[j][1]), 1), s);
    static const int16_t mins_idx[32] = {8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15,
                                         8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15};
    k->c = _mm512_permutexvar_epi16(_mm512_loadu_si512(mins_idx), s);
    __m128 dd = _mm_cvtph_ps(_mm_cvtsi32_si128((int)cuca_ld32(b)));
    k->d = _mm512_broadcastss_ps(dd);
    k->dm = _mm512_broadcastss_ps(_mm_movehdup_ps(dd));
}

static inline __attribute__((always_inline)) void qk_tile(const int wt, const uint8_t *w, const cuca_act *A,
                                                          int64_t m0, const int nr, float *out, int64_t ldo) {
    const int64_t nsb = A->nblk;
    const int mins = wt != GT_Q6_K;
    __m512 acc[QK_T], accm[QK_T];
    for (int r = 0; r < nr; r++) acc[r] = accm[r] = _mm512_setzero_ps();
    for (int64_t sb = 0; sb < nsb; sb++) {
        kblock k;
        k_unpack(wt, w + sb * QKB(wt), &k);
        for (int r = 0; r < nr; r++) {
            const int8_t *a = ACT_QS(A, m0 + r) + QKK * sb;
            const __m512i bs = _mm512_load_si512(ACT_BS(A, m0 + r) + 32 * sb);
            const __m512 da = _mm512_set1_ps(ACT_D(A, m0 + r)[sb]);
            __m512i i0 = _mm512_maddubs_epi16(k.u[0], _mm512_load_si512(a));
            __m512i i1 = _mm512_maddubs_epi16(k.u[1], _mm512_load_si512(a + 64));
            i0 = DPWSSD(_mm512_setzero_si512(), i0, k.v[0]);
            i1 = DPWSSD(_mm512_setzero_si512(), i1, k.v[1]);
            i0 = DPWSSD(i0, _mm512_maddubs_epi16(k.u[2], _mm512_load_si512(a + 128)), k.v[2]);
            i1 = DPWSSD(i1, _mm512_maddubs_epi16(k.u[3], _mm512_load_si512(a + 192)), k.v[3]);
            if (!mins) i0 = DPWSSD(i0, bs, k.c);
            __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(i0, i1)), da);
            acc[r] = _mm512_fmadd_ps(f, k.d, acc[r]);
            if (mins) {
                __m512 g = _mm512_mul_ps(_mm512_cvtepi32_ps(DPWSSD(_mm512_setzero_si512(), bs, k.c)), da);
                accm[r] = _mm512_fmadd_ps(g, k.dm, accm[r]);
            }
        }
    }
    for (int r = 0; r < nr; r++) out[r * ldo] = mins ? hsum512(acc[r]) - hsum512(accm[r]) : hsum512(acc[r]);
}

#elif defined(CUCA_AVX2)
static inline float hsum256(__m256 a) {
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    b = _mm_add_ps(b, _mm_movehl_ps(b, b));
    b = _mm_add_ss(b, _mm_movehdup_ps(b));
    return _mm_cvtss_f32(b);
}

/* codes of the 32 values of group j (natural order) as unsigned bytes */
static inline __m256i k_group(const int wt, const uint8_t *b, int j) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    if (wt == GT_Q6_K) {
        const int h = j >> 2, g = j & 3; /* half of 128, group of 32 inside it */
        __m256i L = _mm256_loadu_si256((const __m256i *)(b + 64 * h + 32 * (g & 1)));
        __m256i H = _mm256_loadu_si256((const __m256i *)(b + 128 + 32 * h));
        L = g < 2 ? _mm256_and_si256(L, m4) : _mm256_and_si256(_mm256_srli_epi16(L, 4), m4);
        H = _mm256_and_si256(_mm256_srli_epi16(H, 2 * g), _mm256_set1_epi8(3));
        return _mm256_or_si256(L, _mm256_slli_epi16(H, 4));
    }
    const uint8_t *qs = b + (wt == GT_Q5_K ? 48 : 16) + 32 * (j >> 1);
    __m256i q = _mm256_loadu_si256((const __m256i *)qs);
    q = (j & 1) ? _mm256_and_si256(_mm256_srli_epi16(q, 4), m4) : _mm256_and_si256(q, m4);
    if (wt == GT_Q5_K) {
        __m256i hb = _mm256_loadu_si256((const __m256i *)(b + 16));
        hb = j <= 4 ? _mm256_slli_epi16(hb, 4 - j) : _mm256_srli_epi16(hb, j - 4);
        q = _mm256_or_si256(q, _mm256_and_si256(hb, _mm256_set1_epi8(0x10)));
    }
    return q;
}

static inline __attribute__((always_inline)) void qk_tile(const int wt, const uint8_t *w, const cuca_act *A,
                                                          int64_t m0, const int nr, float *out, int64_t ldo) {
    const int mins = wt != GT_Q6_K;
    __m256 acc[QK_T], accm[QK_T];
    for (int r = 0; r < nr; r++) acc[r] = accm[r] = _mm256_setzero_ps();
    for (int64_t sb = 0; sb < A->nblk; sb++) {
        const uint8_t *b = w + sb * QKB(wt);
        __m256i isum[QK_T], sc16, cf;
        int16_t scl[16];
        float dw, dmin = 0.0f;
        if (wt == GT_Q6_K) {
            for (int j = 0; j < 16; j++) scl[j] = (int8_t)b[192 + j];
            sc16 = _mm256_loadu_si256((const __m256i *)scl);
            cf = _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16(sc16, 5));
            dw = cuca_h2f(cuca_ld16(b + 208));
        } else {
            uint64_t sc, mn;
            k4_scales(b + 4, &sc, &mn);
            for (int j = 0; j < 8; j++) {
                scl[j] = (int16_t)((sc >> (8 * j)) & 0xff);
                scl[8 + j] = (int16_t)((mn >> (8 * j)) & 0xff);
            }
            sc16 = _mm256_loadu_si256((const __m256i *)scl);
            cf = _mm256_shuffle_epi8(_mm256_permute4x64_epi64(sc16, 0xEE),
                                     _mm256_setr_epi8(0, 1, 0, 1, 2, 3, 2, 3, 4, 5, 4, 5, 6, 7, 6, 7, 8, 9, 8, 9,
                                                      10, 11, 10, 11, 12, 13, 12, 13, 14, 15, 14, 15));
            dw = cuca_h2f(cuca_ld16(b));
            dmin = cuca_h2f(cuca_ld16(b + 2));
        }
        for (int r = 0; r < nr; r++) isum[r] = _mm256_setzero_si256();
        for (int j = 0; j < 8; j++) {
            const __m256i u = k_group(wt, b, j);
            const __m256i s = wt == GT_Q6_K
                ? _mm256_set_m128i(_mm_set1_epi16(scl[2 * j + 1]), _mm_set1_epi16(scl[2 * j]))
                : _mm256_set1_epi16(scl[j]);
            for (int r = 0; r < nr; r++) {
                __m256i a = _mm256_load_si256((const __m256i *)(ACT_QS(A, m0 + r) + QKK * sb + 32 * j));
                isum[r] = _mm256_add_epi32(isum[r], _mm256_madd_epi16(_mm256_maddubs_epi16(u, a), s));
            }
        }
        for (int r = 0; r < nr; r++) {
            const __m256i bs = _mm256_load_si256((const __m256i *)(ACT_BS(A, m0 + r) + 32 * sb));
            const __m256 da = _mm256_set1_ps(ACT_D(A, m0 + r)[sb]);
            __m256i im = _mm256_madd_epi16(bs, cf);
            if (!mins) isum[r] = _mm256_add_epi32(isum[r], im);
            acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(isum[r]), da), _mm256_set1_ps(dw), acc[r]);
            if (mins)
                accm[r] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(im), da), _mm256_set1_ps(dmin), accm[r]);
        }
    }
    for (int r = 0; r < nr; r++) out[r * ldo] = mins ? hsum256(acc[r]) - hsum256(accm[r]) : hsum256(acc[r]);
}

#else /* portable C */
static inline void qk_tile(const int wt, const uint8_t *w, const cuca_act *A, int64_t m0, const int nr, float *out,
                           int64_t ldo) {
    const int mins = wt != GT_Q6_K, gs = wt == GT_Q6_K ? 16 : 32;
    float acc[QK_T] = {0}, accm[QK_T] = {0};
    int32_t code[QKK], scale[16], mn[8];
    for (int64_t sb = 0; sb < A->nblk; sb++) {
        const uint8_t *b = w + sb * QKB(wt);
        const float dw = cuca_h2f(cuca_ld16(wt == GT_Q6_K ? b + 208 : b));
        const float dmin = mins ? cuca_h2f(cuca_ld16(b + 2)) : 0.0f;
        cuca_codes_k(wt, b, code, scale, mn);
        for (int r = 0; r < nr; r++) {
            const int8_t *a = ACT_QS(A, m0 + r) + QKK * sb;
            const int16_t *bs = ACT_BS(A, m0 + r) + 32 * sb;
            const float da = ACT_D(A, m0 + r)[sb];
            int32_t sumi = 0, summ = 0;
            for (int j = 0; j < QKK / gs; j++) {
                int32_t s = 0;
                for (int l = 0; l < gs; l++) s += code[gs * j + l] * a[gs * j + l];
                sumi += scale[j] * s;
            }
            if (mins)
                for (int k = 0; k < 16; k++) summ += mn[k / 2] * bs[k];
            acc[r] += (dw * da) * (float)sumi;
            if (mins) accm[r] += (dmin * da) * (float)summ;
        }
    }
    for (int r = 0; r < nr; r++) out[r * ldo] = acc[r] - accm[r];
}
#endif

#define QKC(wt, n) case n: qk_tile(wt, w, A, m0, n, out, ldo); break
#if QK_T == 8
#define QK_DISPATCH(wt) switch (nr) { QKC(wt, 1); QKC(wt, 2); QKC(wt, 3); QKC(wt, 4); \
    QKC(wt, 5); QKC(wt, 6); QKC(wt, 7); QKC(wt, 8); default: break; }
#else
#define QK_DISPATCH(wt) switch (nr) { QKC(wt, 1); QKC(wt, 2); QKC(wt, 3); QKC(wt, 4); default: break; }
#endif
#define QK_FN(name, wt) \
    static void name(const uint8_t *w, const cuca_act *A, int64_t m0, int nr, float *out, int64_t ldo) { \
        QK_DISPATCH(wt) \
    }
QK_FN(tile_q4_k, GT_Q4_K)
QK_FN(tile_q5_k, GT_Q5_K)
QK_FN(tile_q6_k, GT_Q6_K)

int cuca_tile_k(int wtype, cuca_tile_fn *fn, int *tile) {
    switch (wtype) {
    case GT_Q4_K: *fn = tile_q4_k; break;
    case GT_Q5_K: *fn = tile_q5_k; break;
    case GT_Q6_K: *fn = tile_q6_k; break;
    default: return CUCA_EUNSUPPORTED;
    }
    *tile = QK_T;
    return CUCA_OK;
}
