/* Row-interleaved ("packed") Q4_K weights against Q8_K activations (natural codes and 16 half-group sums:
 * cuca_qk_layout 0), AVX2 build: R = 8 weight rows share one vector, one int32 lane per row, so one broadcast
 * activation dword feeds 8 output rows and each lane sums a whole 32-value group in int16 before the group's 6-bit
 * scale is applied: per group and x row 8 maddubs, 7 adds and one madd for 8 rows (the raw kernel, matmul_k.c,
 * spends a maddubs and a madd on each 32 values of one row).
 *
 * Layout (same size as the raw tensor): rows in groups of 8; per superblock of a group 1152 bytes: the rows' fp16 d
 * (16 bytes), their fp16 dmin (16), dword s < 3 of their 12 scale bytes side by side (3 x 32), then dword t < 8 of
 * qs chunk k < 4 side by side (32 x 32 bytes; low nibbles: values 64k + 4t .. +3, high: 64k + 32 + 4t ..). The
 * n_out % 8 last rows follow raw; raw rows run the same kernel on the same vectors, transposed as they are loaded.
 *
 * Per (weight row, x row) and superblock the exact integer sums isum = sum_j sc_j * sum(code * a) and
 * imin = sum_j m_j * sum(a) (|.| < 2^25), then acc += float(isum) * (d * da), accm += float(imin) * (dmin * da)
 * superblock by superblock in one lane, out = acc - accm: batch invariant, and the same wherever the row is stored.
 * Groups of 16 rows read as two 8-row halves sharing each activation broadcast (matmul_p2.c's Q4_0 form) were
 * measured and dropped: one thread in L2 (Zen 3), cycles per 8-row superblock 119 / 175 / ~300 / 367 at 1 / 2 / 3 /
 * 4 x rows against 132 / 180 / ~258 / 296: the halves' int32 sums and scale vectors spill at 3-4 rows. */
#include "packed.h"

#define P4_SB 1152 /* packed bytes of a group's superblock: 8 rows x 144 */
#define P4_BYTES 144

int cuca_p4k_pack(const void *w, int64_t n_out, int64_t n_in, void *dst) {
    if (n_out <= 0 || n_in <= 0 || n_in % QKK) return CUCA_EINVAL;
    const int64_t nb = n_in / QKK, ng = n_out / 8;
    const size_t rb = (size_t)nb * P4_BYTES, gb = rb * 8;
    const uint8_t *src = (const uint8_t *)w;
    uint8_t *out = (uint8_t *)dst;
    for (int64_t g = 0; g < ng; g++)
        for (int64_t b = 0; b < nb; b++) {
            uint8_t *o = out + g * gb + (size_t)b * P4_SB;
            for (int r = 0; r < 8; r++) {
                const uint8_t *blk = src + (size_t)(g * 8 + r) * rb + (size_t)b * P4_BYTES;
                memcpy(o + 2 * r, blk, 2);           /* d */
                memcpy(o + 16 + 2 * r, blk + 2, 2);  /* dmin */
                for (int s = 0; s < 3; s++) memcpy(o + 32 + 32 * s + 4 * r, blk + 4 + 4 * s, 4);
                for (int u = 0; u < 32; u++) memcpy(o + 128 + 32 * u + 4 * r, blk + 16 + 4 * u, 4);
            }
        }
    memcpy(out + ng * gb, src + ng * gb, (size_t)(n_out - ng * 8) * rb);
    return CUCA_OK;
}

#if defined(CUCA_AVX2)
#define P4_T 4

/* The 8 groups' 6-bit scales sc[j] and mins mn[j] as int16 pairs (v, v) per row lane, from dwords d0..d2 of the
 * rows' 12 scale bytes (the K-quant packing: k4_scales in qmatmul.h) */
static inline __attribute__((always_inline)) void p4_scales(const uint8_t *v, __m256i *sc, __m256i *mn) {
    const __m256i d0 = _mm256_loadu_si256((const __m256i *)v), d1 = _mm256_loadu_si256((const __m256i *)(v + 32));
    const __m256i d2 = _mm256_loadu_si256((const __m256i *)(v + 64));
    const __m256i m6 = _mm256_set1_epi32(63), m4 = _mm256_set1_epi32(15), hi2 = _mm256_set1_epi32(0x30);
    #pragma GCC unroll 4
    for (int j = 0; j < 4; j++) {
        const __m256i s = _mm256_and_si256(_mm256_srli_epi32(d0, 8 * j), m6);
        const __m256i m = _mm256_and_si256(_mm256_srli_epi32(d1, 8 * j), m6);
        const __m256i s4 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(d2, 8 * j), m4),
                                           _mm256_and_si256(_mm256_srli_epi32(d0, 8 * j + 2), hi2));
        const __m256i n4 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(d2, 8 * j + 4), m4),
                                           _mm256_and_si256(_mm256_srli_epi32(d1, 8 * j + 2), hi2));
        sc[j] = _mm256_or_si256(s, _mm256_slli_epi32(s, 16));
        mn[j] = _mm256_or_si256(m, _mm256_slli_epi32(m, 16));
        sc[j + 4] = _mm256_or_si256(s4, _mm256_slli_epi32(s4, 16));
        mn[j + 4] = _mm256_or_si256(n4, _mm256_slli_epi32(n4, 16));
    }
}

/* Superblock sb of 8 rows (v: its 1152 bytes in the packed layout) for nr x rows. Per group the 8 code/activation
 * products summed in int16 (|sum| <= 8 * 2 * 15 * 127 < 2^15: exact in any order), then one madd by the scale. */
static inline __attribute__((always_inline)) void p4_sb(const uint8_t *v, int64_t sb, const int nr,
                                                        const int8_t *const *q, const int16_t *const *bs,
                                                        const float *const *d, __m256 *acc, __m256 *accm) {
    __m256i sc[8], mn[8], isum[P4_T];
    p4_scales(v + 32, sc, mn);
    const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)v));
    const __m256 mw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(v + 16)));
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    #pragma GCC unroll 4
    for (int r = 0; r < nr; r++) isum[r] = _mm256_setzero_si256();
    #pragma GCC unroll 8
    for (int j = 0; j < 8; j++) { /* group j: values 32j.., the low (even j) or high nibbles of chunk j / 2 */
        __m256i p[P4_T];
        #pragma GCC unroll 8
        for (int t = 0; t < 8; t++) {
            const __m256i c = _mm256_loadu_si256((const __m256i *)(v + 128 + 32 * (8 * (j >> 1) + t)));
            const __m256i u = (j & 1) ? _mm256_and_si256(_mm256_srli_epi16(c, 4), m4) : _mm256_and_si256(c, m4);
            #pragma GCC unroll 4
            for (int r = 0; r < nr; r++) {
                const __m256i x = _mm256_maddubs_epi16(u, _mm256_set1_epi32(ld_i32(q[r] + QKK * sb + 32 * j + 4 * t)));
                p[r] = t ? _mm256_add_epi16(p[r], x) : x;
                if (nr > 1) PK_KEEP(p[r]);
            }
        }
        #pragma GCC unroll 4
        for (int r = 0; r < nr; r++) isum[r] = _mm256_add_epi32(isum[r], _mm256_madd_epi16(p[r], sc[j]));
    }
    #pragma GCC unroll 4
    for (int r = 0; r < nr; r++) { /* dword j of the bs area: the int16 sums of group j's two halves */
        const int16_t *h = bs[r] + 32 * sb;
        __m256i im = _mm256_madd_epi16(mn[0], _mm256_set1_epi32(ld_i32(h)));
        #pragma GCC unroll 8
        for (int j = 1; j < 8; j++) im = _mm256_add_epi32(im, _mm256_madd_epi16(mn[j], _mm256_set1_epi32(ld_i32(h + 2 * j))));
        const __m256 da = _mm256_set1_ps(d[r][sb]);
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r]), _mm256_mul_ps(dw, da), acc[r]);
        accm[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(im), _mm256_mul_ps(mw, da), accm[r]);
    }
}

/* One group of 8 weight rows (packed, or raw rows at stride rb != 0): out[r * ldo + i] for rows i < nv. */
static inline __attribute__((always_inline)) void p4_group(const uint8_t *g, int64_t nb, const cuca_act *A,
                                                           int64_t m0, const int nr, float *out, int64_t ldo, int nv,
                                                           const size_t rb) {
    uint8_t buf[P4_SB] __attribute__((aligned(32)));
    __m256 acc[P4_T], accm[P4_T];
    const int8_t *q[P4_T];
    const int16_t *bs[P4_T];
    const float *d[P4_T];
    #pragma GCC unroll 4
    for (int r = 0; r < nr; r++) {
        acc[r] = accm[r] = _mm256_setzero_ps();
        q[r] = ACT_QS(A, m0 + r);
        bs[r] = ACT_BS(A, m0 + r);
        d[r] = ACT_D(A, m0 + r);
    }
    for (int64_t sb = 0; sb < nb; sb++) {
        if (rb) { /* raw rows: the same vectors, row i at cb + i * rb (rows >= nv repeat row nv - 1) */
            const uint8_t *cb = g + (size_t)sb * P4_BYTES;
            /* the next group of rows a slice per superblock (matmul_p6.c: R raw streams leave the prefetchers behind) */
            const uint8_t *nx = g + (size_t)PK_R * rb + (size_t)sb * PK_R * P4_BYTES;
            for (int o = 0; o < PK_R * P4_BYTES; o += 64) _mm_prefetch((const char *)nx + o, _MM_HINT_T1);
            for (int i = 0; i < 8; i++) {
                const uint8_t *row = cb + (size_t)(i < nv ? i : nv - 1) * rb;
                memcpy(buf + 2 * i, row, 2);
                memcpy(buf + 16 + 2 * i, row + 2, 2);
            }
            __m256i t[4];
            pk_rows8(cb + 4, rb, nv, t); /* the 12 scale bytes (and 4 code bytes, unused) */
            for (int s = 0; s < 3; s++) _mm256_store_si256((__m256i *)(buf + 32 + 32 * s), t[s]);
            for (int k = 0; k < 8; k++) pk_rows8(cb + 16 + 16 * k, rb, nv, (__m256i *)(buf + 128 + 128 * k));
            p4_sb(buf, sb, nr, q, bs, d, acc, accm);
        } else {
            const uint8_t *v = g + (size_t)sb * P4_SB;
            #pragma GCC unroll 18
            for (int o = 0; o < P4_SB; o += 64) _mm_prefetch((const char *)v + PK_PF + o, _MM_HINT_T1);
            p4_sb(v, sb, nr, q, bs, d, acc, accm);
        }
    }
    #pragma GCC unroll 4
    for (int r = 0; r < nr; r++) acc[r] = _mm256_sub_ps(acc[r], accm[r]);
    pk_store8(out, ldo, nr, nv, acc);
}

#define P4_CASE(n) case n: p4_group(g, nb, A, m0, n, out, ldo, nv, rb); break;
/* packed group (rb == 0) or raw rows at stride rb: one kernel, so a row's result never depends on its storage */
static void p4_any(const uint8_t *g, int64_t nb, const cuca_act *A, int64_t m0, int nr, float *out, int64_t ldo,
                   int nv, size_t rb) {
    switch (nr) { P4_CASE(1) P4_CASE(2) P4_CASE(3) P4_CASE(4) default: break; }
}
PK_ENTRY_POINTS(p4_any)
#endif

int cuca_tile_p4k(cuca_pk_fn *packed, cuca_tile_fn *raw, int *tile) {
#if defined(CUCA_AVX2)
    if (packed) *packed = p4_any_packed;
    if (raw) *raw = p4_any_raw;
    *tile = P4_T;
    return CUCA_OK;
#elif defined(CUCA_AVX512)
    return cuca_tile_k4p(GT_Q4_K, packed, raw, tile);
#else
    (void)packed; (void)raw; (void)tile;
    return CUCA_EUNSUPPORTED;
#endif
}
